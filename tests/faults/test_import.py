"""`import` is all or nothing, bounded by physics and by the columns every database has."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from autotune.cli.main import main
from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.store.records import DeviceInfo, TrialResult
from autotune.store.repo import BrokenRow, TuningStore

from .conftest import H200_DEVICE, export_doc, export_entry, sm80_config


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/t.db"


def stored(url: str) -> int:
    return len(TuningStore(url).list_best())


def test_a_bad_entry_after_good_ones_imports_nothing(url: str) -> None:
    # 1e-320 us passes a "positive and finite" check and then divides by zero on the way in
    entries = [export_entry(512), export_entry(1024), export_entry(4096, median_us=1e-320)]
    with pytest.raises(BrokenRow, match="median_us"):
        TuningStore(url).import_results(export_doc(entries))
    assert stored(url) == 0


def test_an_import_is_one_transaction(url: str) -> None:
    store = TuningStore(url)
    commits: list[int] = []
    event.listen(store.engine, "commit", lambda conn: commits.append(1))
    entries = [export_entry(64 * (i + 1)) for i in range(40)]
    assert store.import_results(export_doc(entries))["imported"] == 40
    assert len(commits) == 1 and stored(url) == 40


def device(**changes: Any) -> dict[str, Any]:
    return {**H200_DEVICE, **changes}


def problem(**changes: Any) -> dict[str, Any]:
    return {**export_entry()["problem"], **changes}


ABSURD = [
    # (what is wrong, entry changes, fragment of the refusal)
    ("median of 1e-300 s", {"median_us": 1e-294}, "median_us"),
    ("median of 1e-320 us", {"median_us": 1e-320}, "median_us"),
    ("median below 0.5 us", {"median_us": 0.4}, "median_us"),
    ("median over an hour", {"median_us": 3.7e9}, "median_us"),
    ("FLOP/s beyond twice the tensor-core peak", {"median_us": 0.6}, "FLOP/s"),
    ("SDPA at 1e-300 us", {"sdpa_default_us": 1e-300}, "sdpa_default_us"),
    ("negative trials", {"trials": -3}, "trials"),
    ("trials beyond 2^63", {"trials": 2**63}, "trials"),
    ("trials a float", {"trials": 2.5}, "trials"),
    ("sm_count of -1", {"device": device(sm_count=-1)}, "sm_count"),
    ("compute capability 1000", {"device": device(compute_capability=1000)}, "compute_capability"),
    ("compute capability 50", {"device": device(compute_capability=50)}, "compute_capability"),
    ("seqlen of 2^40", {"problem": problem(seqlen_q=2**40, seqlen_k=2**40)}, "seqlen"),
    ("batch of 2^31", {"problem": problem(batch=2**31)}, "batch"),
    ("a 10,000-character device name", {"device": device(name="N" * 10_000)}, "name"),
    (
        "a 100-character driver version",
        {"device": device(driver_version="5" * 100)},
        "driver_version",
    ),
    ("a 1,000-character study name", {"study": "s" * 1000}, "study"),
]


@pytest.mark.parametrize("what, changes, fragment", ABSURD, ids=[a[0] for a in ABSURD])
def test_absurd_values_are_refused_by_name(
    url: str, what: str, changes: dict[str, Any], fragment: str
) -> None:
    good = export_entry(1024)
    with pytest.raises(BrokenRow, match=fragment) as refused:
        TuningStore(url).import_results(export_doc([good, export_entry(**changes)]))
    assert "entry #1" in str(refused.value)
    assert stored(url) == 0


def test_static_constraints_apply_on_a_gpu_this_release_does_not_know(url: str) -> None:
    # 3 stages of 128x128 K/V tiles at D=256 need far more shared memory than any GPU has
    too_big = sm80_config(head_dim=256, block_m=128, block_n=128, num_warps=8, kv_stages=3)
    entry = export_entry(
        device=device(name="NVIDIA Future", compute_capability=110),
        config=too_big,
        problem=problem(head_dim=256),
    )
    with pytest.raises(BrokenRow, match="shared memory"):
        TuningStore(url).import_results(export_doc([entry]))
    assert stored(url) == 0


def test_a_gpu_this_release_does_not_know_is_welcome(url: str) -> None:
    entry = export_entry(device=device(name="NVIDIA Future", compute_capability=110))
    assert TuningStore(url).import_results(export_doc([entry]))["imported"] == 1


def test_duplicate_entries_are_reported(url: str) -> None:
    store = TuningStore(url)
    counts = store.import_results(export_doc([export_entry(), export_entry()]))
    assert counts["imported"] == 1 and counts["duplicates"] == 1
    assert stored(url) == 1
    conflicting = [export_entry(512), export_entry(512, median_us=300.0)]
    with pytest.raises(BrokenRow, match=r"entry #1 .*entry #0"):
        TuningStore(url.replace("t.db", "u.db")).import_results(export_doc(conflicting))


def run_import(path: Path, url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(["import", str(path), "--db", url])
    return rc, capsys.readouterr().err


def test_deeply_nested_json_is_refused_with_a_message(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    rc, err = run_import(path, url, capsys)
    assert rc == 2 and "nested deeper than 64" in err
    doc = export_doc([export_entry()])
    doc["results"][0]["extra"] = json.loads("[" * 70 + "]" * 70)  # valid JSON, 73 levels
    path.write_text(json.dumps(doc))
    rc, err = run_import(path, url, capsys)
    assert rc == 2 and "nested deeper than 64" in err
    assert stored(url) == 0


def test_a_file_over_256_mib_is_refused_unread(
    tmp_path: Path, url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:  # sparse: costs no disk
        f.truncate(256 * 1024 * 1024 + 1)
    rc, err = run_import(path, url, capsys)
    assert rc == 2 and "256 MiB" in err


def test_string_columns_have_one_bound_on_every_database(url: str) -> None:
    """A record written by the tuner itself (not an import) with a device name longer than its
    column is refused on SQLite as it is on PostgreSQL, before anything is written."""
    store = TuningStore(url)
    long_name = DeviceInfo("N" * 10_000, 90, 132, "580", "13.0")
    result = TrialResult(Config.from_dict(sm80_config()), "ok", median_us=400.0)
    with pytest.raises(ValueError, match="devices.name"):
        store.record_trial(
            long_name,
            Problem(4, 16, 16, 2048, 2048, 128),
            result,
            build=None,
            study="s",
            phase="search",
            baseline_us=None,
        )
    assert store.trials() == []


@pytest.mark.postgres
def test_postgres_gets_a_message_not_a_data_error(postgres_url: str) -> None:
    store = TuningStore(postgres_url)
    entries = [export_entry(512), export_entry(device=device(name="N" * 10_000))]
    with pytest.raises(BrokenRow, match="name"):
        store.import_results(export_doc(entries))
    assert store.list_best() == []
    assert store.import_results(export_doc(entries[:1]))["imported"] == 1


def test_the_fixture_entries_are_valid(url: str) -> None:
    entries = [export_entry(512), export_entry(1024)]
    assert TuningStore(url).import_results(export_doc(entries))["imported"] == 2
    assert os.path.exists(url[len("sqlite:///") :])
