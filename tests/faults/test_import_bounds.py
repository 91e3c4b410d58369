"""Checking an import costs time and memory by the file's size, never by the numbers in it, and
a number beyond any float is refused in one line naming its entry and field (issue 37, item 3).

Before: a causal problem with lengths near 2^31 kept `import` CPU-bound for minutes (its FLOP
count summed the visible keys row by row), and a median of 10^400 (a JSON integer no float
holds) ended in an OverflowError traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from autotune.cli.main import main
from autotune.model.problem import MAX_SIZE, Problem
from autotune.store.repo import TuningStore

from .conftest import export_doc, export_entry

REPO = Path(__file__).resolve().parents[2]
BIG = MAX_SIZE  # the largest size the contract allows: 2^31 - 1
# a sm80 config's FLOP bound makes a real median of such a problem years long; the entries
# below are refused or stored on their numbers, and either way in a moment
HUGE_CAUSAL = [
    {"seqlen_q": BIG, "seqlen_k": BIG},
    {"seqlen_q": BIG, "seqlen_k": 1},
    {"seqlen_q": 1, "seqlen_k": BIG},
    {"seqlen_q": BIG - 12345, "seqlen_k": BIG},
    {"seqlen_q": BIG, "seqlen_k": BIG // 3},
    {"seqlen_q": BIG, "seqlen_k": BIG, "batch": BIG, "heads_q": BIG, "heads_kv": 1},
]


def _problem(**changes: Any) -> dict[str, Any]:
    return {**export_entry()["problem"], "causal": True, **changes}


def _entry(**problem: Any) -> dict[str, Any]:
    causal = export_entry()["config"] | {"causal": True}
    return export_entry(problem=_problem(**problem), config=causal)


def _import_seconds(tmp_path: Path, doc: dict[str, Any] | str) -> tuple[float, int, str]:
    """`cute-autotune import` of `doc` in a process of its own, stopped after 60 s: (seconds,
    exit status, stderr)."""
    path = tmp_path / "hostile.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    start = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "import",
            str(path),
            "--db",
            f"sqlite:///{tmp_path}/t.db",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return time.perf_counter() - start, done.returncode, done.stderr


@pytest.mark.parametrize(
    "sizes", HUGE_CAUSAL, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
)
def test_the_flop_count_is_a_closed_form(sizes: dict[str, int]) -> None:
    problem = Problem(**(_problem(**sizes) | {"causal": True}))
    start = time.perf_counter()
    pairs = problem.visible_pairs
    assert time.perf_counter() - start < 0.01
    lq, lk = problem.seqlen_q, problem.seqlen_k
    # bottom-right causal: the last min(lq, lk) rows form a triangle, rows above see nothing
    rows = min(lq, lk)
    assert pairs == rows * (rows + 1) // 2 + rows * (lk - rows)


def test_the_closed_form_matches_counting_row_by_row() -> None:
    for lq in range(1, 40):
        for lk in range(1, 40):
            counted = sum(max(0, min(lk, i + 1 + lk - lq)) for i in range(lq))
            assert Problem(1, 1, 1, lq, lk, 64, causal=True).visible_pairs == counted, (lq, lk)


def test_an_import_of_hostile_sizes_takes_seconds(
    tmp_path: Path, fault_summary: Callable[[dict[str, Any]], None]
) -> None:
    doc = export_doc([_entry(**sizes) for sizes in HUGE_CAUSAL])
    seconds, status, stderr = _import_seconds(tmp_path, doc)
    fault_summary(
        {
            "case": f"import of {len(HUGE_CAUSAL)} causal entries with lengths near "
            "2^31 (a process of its own)",
            "seconds": round(seconds, 2),
            "status": status,
            "traceback": "Traceback" in stderr,
        }
    )
    assert "Traceback" not in stderr, stderr[-3000:]
    assert status in (0, 2), stderr
    assert seconds < 20, f"import took {seconds:.1f} s"  # a process's start included


OUT_OF_RANGE = [
    # (entry field, how it is spelt in the JSON, fragment of the refusal)
    ("median_us", '"median_us": 1' + "0" * 400, "median_us"),
    ("sdpa_default_us", '"sdpa_default_us": 1' + "0" * 400, "sdpa_default_us"),
    ("p20_us", '"p20_us": -1' + "0" * 400, "p20_us"),
    ("runner_up_us", '"runner_up_us": 1e400', "runner_up_us"),
    ("trials", '"trials": 1' + "0" * 400, "trials"),
    ("sm_count", None, "sm_count"),
    ("seqlen_q", None, "seqlen_q"),
    ("block_m", None, "block_m"),
]


@pytest.mark.parametrize("field, spelt, fragment", OUT_OF_RANGE, ids=[o[0] for o in OUT_OF_RANGE])
def test_numbers_beyond_float_range_are_refused_in_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    field: str,
    spelt: str | None,
    fragment: str,
    fault_summary: Callable[[dict[str, Any]], None],
) -> None:
    entry = export_entry(1024)
    marker = 123456.789
    if field == "sm_count":
        entry["device"]["sm_count"] = marker
    elif field == "seqlen_q":
        entry["problem"]["seqlen_q"] = marker
    elif field == "block_m":
        entry["config"]["block_m"] = marker
    else:
        entry[field] = marker
    text = json.dumps(export_doc([export_entry(512), entry]))
    text = text.replace(str(marker), "1" + "0" * 400 if spelt is None else spelt.split(": ", 1)[1])
    path = tmp_path / "hostile.json"
    path.write_text(text)
    url = f"sqlite:///{tmp_path}/t.db"
    status = main(["import", str(path), "--db", url])
    err = capsys.readouterr().err
    fault_summary(
        {
            "case": f"import of a {field} no float holds",
            "status": status,
            "said": err.strip()[:160],
        }
    )
    assert status == 2
    assert "entry #1" in err and fragment in err, err
    assert len(max(err.splitlines(), key=len)) < 300, err  # the number is not printed whole
    assert TuningStore(url).list_best() == []


def test_a_number_past_pythons_digit_limit_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = json.dumps(export_doc([export_entry(median_us=123.25)]))
    path = tmp_path / "hostile.json"
    path.write_text(text.replace("123.25", "1" + "0" * 5000))
    assert main(["import", str(path), "--db", f"sqlite:///{tmp_path}/t.db"]) == 2
    err = capsys.readouterr().err
    assert "not valid JSON" in err and len(err.splitlines()) == 1, err
