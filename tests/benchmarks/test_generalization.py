"""benchmarks/generalization.py (issue 38, item 6) without a GPU: the problems drawn from a seed
alone and within their bounds, the exhaustive group spread over kinds, head dims and dtypes, a
draw refused when the tuning or the model's fit saw one of its problems, the search's commands
(their shape files hold exactly the drawn problems) and the verdict over measured rows."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from autotune.model import Problem, load_shape_set

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        "generalization", REPO / "benchmarks" / "generalization.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["generalization"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_draw_depends_on_the_seed_alone_and_keeps_its_bounds(bench: ModuleType) -> None:
    first, again, other = bench.draw(7, 60), bench.draw(7, 60), bench.draw(8, 60)
    assert [d.problem for d in first] == [d.problem for d in again]
    assert [d.problem for d in first] != [d.problem for d in other]
    assert len({d.problem for d in first}) == 60
    assert sum(d.kind == "decode" for d in first) == 30
    models = {name: (hq, hkv, dim) for name, hq, hkv, dim in bench.MODELS}
    for d in bench.draw(3, 400):
        p = d.problem
        assert (p.heads_q, p.heads_kv, p.head_dim) == models[d.model]
        assert bench.MIN_LENGTH <= p.seqlen_k < bench.MAX_LENGTH and p.seqlen_k % 2 == 1
        assert 1 <= p.batch <= bench.MAX_BATCH
        if d.kind == "decode":
            assert 1 <= p.seqlen_q <= 16 and p.causal
            assert (
                p.batch == 1
                or 4 * p.batch * p.heads_kv * p.seqlen_k * p.head_dim <= bench.MAX_KV_BYTES
            )
        else:
            assert bench.MIN_LENGTH <= p.seqlen_q <= p.seqlen_k
            assert p.batch == 1 or p.batch * p.seqlen_k <= bench.MAX_PREFILL_TOKENS
    everything = bench.draw(3, 400)
    assert {d.problem.dtype for d in everything} == {"fp16", "bf16"}
    assert {d.layout for d in everything} == {"bhld", "blhd"}
    assert {d.problem.head_dim for d in everything} == {64, 96, 128, 256}
    assert any(d.problem.heads_kv == 1 for d in everything)  # MQA
    assert {d.problem.group_size for d in everything} >= {5, 7}


def test_the_exhaustive_group_spans_kinds_head_dims_and_dtypes(bench: ModuleType) -> None:
    drawn = bench.draw(11, 60)
    group = bench.exhaustive_group(drawn, 16, 11)
    assert len(group) == len(set(group)) == 16
    chosen = [drawn[i] for i in group]
    assert {d.kind for d in chosen} == {"prefill", "decode"}
    assert {d.problem.dtype for d in chosen} == {"fp16", "bf16"}
    assert len({d.problem.head_dim for d in chosen}) >= 3
    assert group == bench.exhaustive_group(drawn, 16, 11)
    assert len(bench.exhaustive_group(drawn[:5], 16, 11)) == 5


def _args(bench: ModuleType, **kw: Any) -> Any:
    import argparse

    return argparse.Namespace(**{"seed": 7, "count": 60, "model": [], "exhaustive": 16, **kw})


def test_a_draw_the_shipped_results_hold_is_refused(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    import autotune.runtime

    victim = bench.draw(7, 60)[5].problem
    monkeypatch.setattr(
        autotune.runtime,
        "shipped_results",
        lambda: [{"results": [{"problem": victim.as_dict()}, {"problem": {"batch": "broken"}}]}],
    )
    with pytest.raises(SystemExit, match="shipped db/ results") as refused:
        bench.checked_draw(_args(bench))
    assert victim.describe() in str(refused.value)


def test_a_draw_the_model_was_fitted_on_is_refused(bench: ModuleType, tmp_path: Path) -> None:
    from autotune.model.perf_model import digest_of, problem_row

    pytest.importorskip("sklearn")
    from autotune.model import Config
    from autotune.tune.fit_model import Timing, fit

    drawn = bench.draw(7, 60)
    sdpa = [
        Config.make("sdpa", {"backend": b, **d.problem.space_values()})
        for d in drawn[:10]
        for b in ("flash", "cudnn")
    ]
    data = [
        Timing(d.problem, c, 10.0 + i)
        for i, (d, c) in enumerate(
            zip([x for x in drawn[:10] for _ in range(2)], sdpa, strict=True)
        )
    ]
    doc = fit(data * 2, "NVIDIA H200", trees=3)
    assert drawn[3].problem in {Problem(*row) for row in doc["fit_problems"]}
    path = tmp_path / "model.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SystemExit, match="the fit of"):
        bench.checked_draw(_args(bench, model=[str(path)]))
    doc["fit_problems"] = [problem_row(Problem(1, 1, 1, 3, 3, 64))]
    doc["digest"] = digest_of(doc)
    path.write_text(json.dumps(doc))
    assert len(bench.checked_draw(_args(bench, model=[str(path)]))) == 60


def test_the_search_tunes_exactly_the_drawn_problems(bench: ModuleType, tmp_path: Path) -> None:
    drawn = bench.draw(7, 60)
    args = _args(bench, scratch_db="sqlite:///scratch.db", budget=160)
    exhaustive, budget = bench.search_commands(drawn, args, tmp_path)
    assert "grid" in exhaustive and "--skip-tuned" in exhaustive and "160" in budget
    group = set(bench.exhaustive_group(drawn, 16, 7))
    for command, members in (
        (exhaustive, [d for d in drawn if d.index in group]),
        (budget, [d for d in drawn if d.index not in group]),
    ):
        shapes = command[command.index("--shapes") + 1]
        assert load_shape_set(shapes) == [d.problem for d in members]


def _row(
    index: int,
    ours: float,
    sdpa: float,
    *,
    p80: float | None = None,
    best: float | None = None,
    search: str = "budget",
    twin: float | None = None,
    problem: Problem | None = None,
) -> dict[str, Any]:
    problem = problem or Problem(1, 32, 8, 2001, 2001, 128, "bf16", True)
    times = {"ours": ours, "sdpa_default": sdpa, "sdpa_flash": sdpa * 1.2}
    if best is not None:
        times["best"] = best
    row: dict[str, Any] = {
        "index": index,
        "kind": "prefill",
        "layout": "bhld",
        "shape": f"row {index}",
        "problem": problem.as_dict(),
        "median_us": times,
        "search": search,
        "speedup_vs_sdpa_default": sdpa / ours,
        "dispatch": "sm90",
        "ratio_vs_sdpa_default": {
            "ours": {
                "median": sdpa / ours,
                "p20": sdpa / ours - 0.02,
                "p80": p80 if p80 is not None else sdpa / ours,
            }
        },
    }
    if twin is not None:
        row["twin"] = {"speedup_vs_sdpa_default": twin}
    return row


def test_the_verdict(bench: ModuleType) -> None:
    rows = [
        _row(0, 100, 100, best=99, search="exhaustive"),
        _row(1, 100, 97, p80=0.985),
        _row(2, 100, 120, best=100),
    ]
    verdict = bench.judge(rows)
    assert verdict["floor"]["holds"]  # row 1 reads 0.97x, its spread reaches 0.98
    assert verdict["regret_exhaustive"]["holds"] and verdict["regret_budget"]["searched"] == 1
    assert verdict["regret_budget"]["worst"] == pytest.approx(1.0)
    rows.append(_row(3, 100, 90, p80=0.95, best=80))
    verdict = bench.judge(rows)
    assert verdict["floor"]["below"] == ["row 3"]
    assert verdict["regret_budget"]["worst"] == pytest.approx(100 / 80)
    assert not verdict["regret_budget"]["holds"]
    decode = Problem(4, 32, 8, 8, 8191, 128, "fp16", True)
    fp16 = [_row(10, 10, 40, twin=4.1, problem=decode), _row(11, 10, 35, twin=3.8, problem=decode)]
    assert bench.judge(fp16)["fp16_decode_gqa"]["holds"]
    fp16.append(_row(12, 10, 30, twin=4.0, problem=decode))  # 3.0x against a twin's 4.0x
    verdict = bench.judge(fp16)["fp16_decode_gqa"]
    assert verdict["below_twin"] == ["row 12"] and not verdict["holds"]


def test_help_and_report(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as shown:
        bench.main(["--help"])
    assert shown.value.code == 0 and "generalization" in capsys.readouterr().out
    path = tmp_path / "rows.json"
    path.write_text(json.dumps({"seed": 7, "rows": [_row(0, 100, 110, best=95)]}))
    assert bench.main(["report", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "row 0" in out and '"regret_budget"' in out
