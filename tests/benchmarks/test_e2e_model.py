"""benchmarks/e2e_model.py (issue 39, item 4) without a GPU: a smoke run of the tiny model on the
CPU writes a row per phase (prefill, verify, decode, generate) with both implementations
timed, logits equal to "sdpa"'s and greedy tokens equal; a failing row is recorded and the
run goes on."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
REPO = Path(__file__).resolve().parents[2]


def _bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "e2e_model", REPO / "benchmarks" / "e2e_model.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["e2e_model"] = module
    spec.loader.exec_module(module)
    return module


SMOKE = [
    "--tiny",
    "--device",
    "cpu",
    "--prefill",
    "48",
    "--verify",
    "4",
    "--cache",
    "60",
    "--batches",
    "2",
    "--decode-cache",
    "40",
    "--prompt",
    "12",
    "--new-tokens",
    "6",
    "--reps",
    "2",
]


def test_a_smoke_run_writes_every_phase(tmp_path: Path) -> None:
    out = tmp_path / "e2e.json"
    assert _bench().main([*SMOKE, "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert [r["phase"] for r in doc["rows"]] == ["prefill", "verify", "decode", "generate"]
    assert doc["model"]["layers"] == 2 and doc["implementations"][1] == "sdpa"
    for row in doc["rows"]:
        assert set(row["median_ms"]) >= {"ours", "sdpa"} and row["speedup"] > 0
        assert row["speedup_p20"] <= row["speedup_p80"]
        if row["phase"] == "generate":
            assert row["tokens_equal"] and row["tokens_per_s"]["ours"] > 0
        else:
            assert row["logits_rel_diff"] < 1e-4


def test_a_failing_row_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _bench()
    real = bench.run_row

    def flaky(model, row, *args):  # type: ignore[no-untyped-def]
        if row["phase"] == "verify":
            raise RuntimeError("out of memory, say")
        return real(model, row, *args)

    monkeypatch.setattr(bench, "run_row", flaky)
    out = tmp_path / "e2e.json"
    assert bench.main([*SMOKE, "--json", str(out)]) == 1
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 4 and "out of memory" in rows[1]["error"] and "speedup" in rows[3]
