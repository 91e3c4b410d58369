"""One bad row of each kind (wrong type, a reference to nothing, bytes that are not UTF-8, an
impossible value) in each table, read by each command that reads it: the row is refused by
table and id, and the rest is served (issue 37, item 4).

Before: a best row naming a config or problem that is not there, or a config stored as bytes,
made `best`, `list`, `export` and `report` end in a traceback; a problem with zero KV heads
stopped `best` and `report`; a measurement with text for a time stopped `report`; a runtime
miss or work item naming no problem stopped `misses` and `queue`; dispatch dropped its lookups
for every problem ("tuning database unavailable"); a refused exact row made `best` exit
instead of serving the nearest problem as dispatch does.

Each case damages one row of a database of 2 GPUs x 3 problems (a best, a measurement with a
build, a baseline, a runtime miss and a work item each) the way SQLite stores it without a
word (text in a number column, bytes in a text column, a foreign key to nothing: SQLite
enforces none for another program) or, on PostgreSQL, the nearest its types and constraints
let through.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from autotune.build.compiler import BuildResult
from autotune.cli.main import main
from autotune.measure.records import BaselineTiming
from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.status import Status
from autotune.model.target import target_for_capability
from autotune.runtime.dispatch import Dispatcher
from autotune.store.queue import WorkQueue
from autotune.store.records import DeviceInfo, TrialResult
from autotune.store.repo import TuningStore

from .conftest import sm80_config

H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
H100 = DeviceInfo("NVIDIA H100", 90, 132, "580.159.04", "13.0")
PROBLEMS = [Problem(4, 16, 16, n, n, 128, "fp16", False) for n in (2048, 1024, 4096)]
ROWS = 6  # of each table: 2 devices x 3 problems

# the damaged rows: the H200's device, the first problem (2048), the config of the first and
# third problems (block_m 128), and the first problem's rows of the other tables
P1 = "(select id from problems where seqlen_q = 2048)"
H200_ID = "(select id from devices where name = 'NVIDIA H200')"
CONFIG = "(select min(id) from kernel_configs)"
ON_H200 = f"problem_id = {P1} and device_id = {H200_ID}"
MISS_ON_H200 = f"problem_id = {P1} and device_name = 'NVIDIA H200'"  # misses name their GPU


@dataclass(frozen=True)
class Damage:
    name: str
    sqlite: str
    postgresql: str | None  # None: PostgreSQL's types or constraints keep it out
    refused: str  # how the refusal names the row
    bests: int = 0  # best rows it leaves unservable
    misses: int = 0
    items: int = 0
    h200_gone: bool = False  # no best of the H200 can be served


def _update(table: str, column: str, value: str, where: str) -> str:
    return f"update {table} set {column} = {value} where {where}"


DAMAGES = [
    # devices
    Damage(
        "devices.compute_capability text",
        _update("devices", "compute_capability", "'ninety'", f"id = {H200_ID}"),
        _update("devices", "compute_capability", "7", f"id = {H200_ID}"),
        "stored device #",
        bests=3,
        h200_gone=True,
    ),
    Damage(
        "devices.sm_count zero",
        _update("devices", "sm_count", "0", f"id = {H200_ID}"),
        _update("devices", "sm_count", "0", f"id = {H200_ID}"),
        "stored device #",
        bests=3,
        h200_gone=True,
    ),
    Damage(
        "devices.name not UTF-8",
        _update("devices", "name", "CAST(X'4E5649444941FF' AS TEXT)", f"id = {H200_ID}"),
        None,
        "stored device #",
        bests=3,
        h200_gone=True,
    ),
    # problems
    Damage(
        "problems.heads_kv zero",
        _update("problems", "heads_kv", "0", f"id = {P1}"),
        # PostgreSQL divides by it in a check: a negative count passes that check
        _update("problems", "heads_kv", "-16", f"id = {P1}"),
        "stored problem #",
        bests=2,
        misses=2,
        items=2,
    ),
    Damage(
        "problems.seqlen_k text",
        _update("problems", "seqlen_k", "'long'", f"id = {P1}"),
        _update("problems", "seqlen_k", "-7", f"id = {P1}"),
        "stored problem #",
        bests=2,
        misses=2,
        items=2,
    ),
    Damage(
        "problems.dtype not UTF-8",
        _update("problems", "dtype", "CAST(X'FF' AS TEXT)", f"id = {P1}"),
        _update("problems", "dtype", "'fp7'", f"id = {P1}"),
        "stored problem #",
        bests=2,
        misses=2,
        items=2,
    ),
    # kernel_configs (the config of the first and third problems, on both GPUs)
    Damage(
        "kernel_configs.config_json not JSON",
        _update("kernel_configs", "config_json", "'{'", f"id = {CONFIG}"),
        _update("kernel_configs", "config_json", "'{'", f"id = {CONFIG}"),
        "stored config ",
        bests=4,
    ),
    Damage(
        "kernel_configs.config_json bytes",
        _update("kernel_configs", "config_json", "X'FF00FE'", f"id = {CONFIG}"),
        _update("kernel_configs", "config_json", "E'\\\\xff'", f"id = {CONFIG}"),
        "stored config ",
        bests=4,
    ),
    Damage(
        "kernel_configs.config_json not UTF-8",
        _update("kernel_configs", "config_json", "CAST(X'7BFF7D' AS TEXT)", f"id = {CONFIG}"),
        None,
        "stored config ",
        bests=4,
    ),
    Damage(
        "kernel_configs.config_json another config",
        _update("kernel_configs", "config_json", '\'{"family": "sm80"}\'', f"id = {CONFIG}"),
        _update("kernel_configs", "config_json", '\'{"family": "sm80"}\'', f"id = {CONFIG}"),
        "stored config ",
        bests=4,
    ),
    # best_configs
    Damage(
        "best_configs.config_id to nothing",
        _update("best_configs", "config_id", "99999", ON_H200),
        _update("best_configs", "config_id", "99999", ON_H200),
        "stored best config #",
        bests=1,
    ),
    Damage(
        "best_configs.device_id to nothing",
        _update("best_configs", "device_id", "99999", ON_H200),
        _update("best_configs", "device_id", "99999", ON_H200),
        "stored best config #",
        bests=1,
    ),
    Damage(
        "best_configs.problem_id to nothing",
        _update("best_configs", "problem_id", "99999", ON_H200),
        _update("best_configs", "problem_id", "99999", ON_H200),
        "stored best config #",
        bests=1,
    ),
    Damage(
        "best_configs.median_us text",
        _update("best_configs", "median_us", "'fast'", ON_H200),
        _update("best_configs", "median_us", "-1", ON_H200),
        "stored best config #",
        bests=1,
    ),
    Damage(
        "best_configs.trials text",
        _update("best_configs", "trials", "'many'", ON_H200),
        _update("best_configs", "trials", "-5", ON_H200),
        "stored best config #",
        bests=1,
    ),
    Damage(
        "best_configs.speedup_vs_default not its times",
        _update("best_configs", "speedup_vs_default", "1e300", ON_H200),
        _update("best_configs", "speedup_vs_default", "1e300", ON_H200),
        "stored best config #",
        bests=1,
    ),
    # measurements, builds, baselines (read by report and dispatch)
    Damage(
        "measurements.config_id to nothing",
        _update("measurements", "config_id", "99999", ON_H200),
        _update("measurements", "config_id", "99999", ON_H200),
        "stored measurement #",
    ),
    Damage(
        "measurements.median_us text",
        _update("measurements", "median_us", "'fast'", ON_H200),
        _update("measurements", "median_us", "-1", ON_H200),
        "stored measurement #",
    ),
    Damage(
        "builds.artifact_key a path",
        _update(
            "builds",
            "artifact_key",
            "'../../cubins/x'",
            f"id = (select build_id from measurements where {ON_H200})",
        ),
        _update(
            "builds",
            "artifact_key",
            "'../../cubins/x'",
            f"id = (select build_id from measurements where {ON_H200})",
        ),
        "stored build #",
    ),
    Damage(
        "baselines.median_us text",
        _update("baselines", "median_us", "'fast'", ON_H200),
        _update("baselines", "median_us", "-1", ON_H200),
        "stored baseline #",
    ),
    # runtime_misses
    Damage(
        "runtime_misses.count text",
        _update("runtime_misses", "count", "'often'", f"problem_id = {P1}"),
        _update("runtime_misses", "count", "-3", f"problem_id = {P1}"),
        "stored runtime miss #",
        misses=2,
    ),
    Damage(
        "runtime_misses.problem_id to nothing",
        _update("runtime_misses", "problem_id", "99999", f"problem_id = {P1}"),
        _update("runtime_misses", "problem_id", "99999", f"problem_id = {P1}"),
        "stored runtime miss #",
        misses=2,
    ),
    Damage(
        "runtime_misses.device_name not UTF-8",
        _update("runtime_misses", "device_name", "CAST(X'4EFF' AS TEXT)", MISS_ON_H200),
        None,
        "stored runtime miss #",
        misses=1,
    ),
    # work_items
    Damage(
        "work_items.problem_id to nothing",
        _update("work_items", "problem_id", "99999", f"problem_id = {P1}"),
        _update("work_items", "problem_id", "99999", f"problem_id = {P1}"),
        "stored work item #",
        items=2,
    ),
    Damage(
        "work_items.compute_capability text",
        _update("work_items", "compute_capability", "'ninety'", f"problem_id = {P1}"),
        _update("work_items", "compute_capability", "0", f"problem_id = {P1}"),
        "stored work item #",
        items=2,
    ),
    Damage(
        "work_items.state unknown",
        _update("work_items", "state", "'paused'", f"problem_id = {P1}"),
        _update("work_items", "state", "'paused'", f"problem_id = {P1}"),
        "stored work item #",
        items=2,
    ),
    Damage(
        "work_items.families a path",
        _update("work_items", "families", "'sm80,../../x'", f"problem_id = {P1}"),
        _update("work_items", "families", "'sm80,../../x'", f"problem_id = {P1}"),
        "stored work item #",
        items=2,
    ),
]


def _populate(url: str) -> None:
    store = TuningStore(url)
    now = datetime.now(UTC)
    for device in (H200, H100):
        for i, problem in enumerate(PROBLEMS):
            config = Config.from_dict(sm80_config(block_m=64 if i == 1 else 128))
            key = hashlib.sha256(f"{device.name} {i}".encode()).hexdigest()[:32]
            result = TrialResult(config, Status.OK, median_us=100.0 * (i + 1))
            trial = store.record_trial(
                device,
                problem,
                result,
                build=BuildResult(config, "sm_90a", Status.OK, key=key),
                study="s",
                phase="search",
                baseline_us=300.0 * (i + 1),
            )
            store.set_best(
                device,
                problem,
                result,
                measurement_id=trial,
                study="s",
                trials=24,
                sdpa_default_us=200.0 * (i + 1),
                sdpa_flash_us=None,
            )
            store.record_baselines(
                device,
                problem,
                "s",
                [BaselineTiming("default", 200.0 * (i + 1), 190.0 * (i + 1), 210.0 * (i + 1))],
            )
        store.add_misses([(device, p, "nearest", 3, now, now) for p in PROBLEMS])
        WorkQueue(store).enqueue(device, PROBLEMS, [], {"trials": 3})
    store.engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _database(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/t.db"
    return str(request.getfixturevalue("postgres_url"))


def _damage(url: str, sql: str) -> None:
    engine = create_engine(url)
    with engine.begin() as c:
        if engine.dialect.name == "postgresql":  # foreign keys not enforced in this session
            c.execute(text("set session_replication_role = replica"))
        assert c.execute(text(sql)).rowcount >= 1, sql
    engine.dispose()


def _run(argv: list[str], url: str) -> tuple[int, str, str]:
    """A command in this process: (exit status, standard output, standard error). An exception
    that leaves `main` fails the test with its traceback."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([*argv, "--db", url])
    return status, out.getvalue(), err.getvalue()


BEST_ARGS = [
    "best",
    "--batch",
    "4",
    "--heads-q",
    "16",
    "--seqlen-q",
    "2048",
    "--head-dim",
    "128",
    "--device",
    "NVIDIA H200",
]


@pytest.mark.parametrize("damage", DAMAGES, ids=lambda d: d.name)
def test_a_bad_row_is_refused_by_name_and_every_command_serves_the_rest(
    damage: Damage,
    backend: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
    fault_summary: Callable[[dict[str, Any]], None],
) -> None:
    sql = damage.sqlite if backend == "sqlite" else damage.postgresql
    if sql is None:
        pytest.skip("PostgreSQL's types keep this value out")
    url = _database(backend, tmp_path, request)
    _populate(url)
    _damage(url, sql)
    served: dict[str, Any] = {}
    with caplog.at_level(logging.WARNING, logger="autotune"):
        status, listed, list_err = _run(["list"], url)
        served["list"] = (status, int(listed.strip().splitlines()[-1].split()[0]))
        status, _, _ = _run(["export", "-o", str(tmp_path / "export.json")], url)
        served["export"] = (
            status,
            len(json.loads((tmp_path / "export.json").read_text())["results"]),
        )
        status, _, _ = _run(["report", "--json", str(tmp_path / "report.json")], url)
        report = (
            json.loads((tmp_path / "report.json").read_text())
            if (tmp_path / "report.json").exists()
            else []
        )
        served["report"] = (status, len(report))
        status, missed, _ = _run(["misses", "--json"], url)
        served["misses"] = (status, len(json.loads(missed)))
        status, _, _ = _run(["queue"], url)
        served["queue"] = (status, len(WorkQueue(TuningStore(url, create=False)).items()))
        status, _, _ = _run([*BEST_ARGS, "--json", str(tmp_path / "best.json")], url)
        best = json.loads((tmp_path / "best.json").read_text()) if status == 0 else None
        served["best"] = (status, best and (best["match"], best["problem"]["seqlen_q"]))
        dispatcher = Dispatcher(url, use_shipped=False)
        decisions = [dispatcher.would_run(p, H200, target_for_capability(90)) for p in PROBLEMS]
        served["dispatch"] = [d.path for d in decisions]
    refusals = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    refusals += [line for line in list_err.splitlines() if line.startswith("refused")]
    refusals += [note for d in decisions for note in d.skipped]
    fault_summary(
        {
            "case": f"bad row: {damage.name}",
            "backend": backend,
            "served": served,
            "refused": [r[:160] for r in sorted(set(refusals))[:3]],
        }
    )

    assert served["list"] == (0, ROWS - damage.bests)
    assert served["export"] == (0, ROWS - damage.bests)
    assert served["report"] == (0, ROWS - damage.bests)
    assert served["misses"] == (0, ROWS - damage.misses)
    assert served["queue"] == (0, ROWS - damage.items)
    assert any(damage.refused in r for r in refusals), refusals
    assert not any("unavailable" in note for d in decisions for note in d.skipped)
    if damage.h200_gone:
        assert served["best"] == (1, None)
        assert served["dispatch"] == ["heuristic"] * 3
        return
    # the first problem's own best is served when it is not the damaged one, else the
    # nearest problem's (the second, 1024, and never the damaged row)
    own_row_broken = damage.bests > 0
    assert served["best"] == (0, ("nearest", 1024) if own_row_broken else ("exact", 2048))
    assert served["dispatch"][0] == ("nearest" if own_row_broken else "exact")
    assert served["dispatch"][1] == "exact"
