"""Text from outside never reaches a terminal raw, and SQLite and PostgreSQL take or refuse the
same strings (issue 37, item 5).

Before: an imported device name with an escape sequence cleared the screen when `list` or
`best` printed it, and one with a newline forged an output line; a decision, torch version or
regime did the same in `best`, a worker's name or message in `queue`. A NUL was stored on
SQLite and refused by PostgreSQL with a database error.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from autotune.cli.main import main
from autotune.model.config import Config
from autotune.model.status import Status
from autotune.store.records import TrialResult
from autotune.store.repo import TuningStore

from .conftest import export_doc, export_entry, sm80_config
from .test_bad_row_per_command import BEST_ARGS, H200, PROBLEMS, _populate

# what a hostile string does in a terminal: clears it, forges a line, rewrites one, rings, and
# turns the rest of the line around (a bidirectional override)
# (16 characters at most: each fits the narrowest column it is written to)
HOSTILE = {
    "escape sequence": "H200\x1b[2J\x1b[H",
    "newline": "H200\nforged: 1",
    "carriage return": "H200\rforged",
    "NUL": "H200\x00",
    "bidi override": "H\u202e002H",
}
# a line of output that a hostile value made: control characters (a newline and a tab are
# the output's own) or a line that begins with the forged text
RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]|^forged", re.M)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/t.db"
    return str(request.getfixturevalue("postgres_url"))


def _run(argv: list[str], url: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([*argv, "--db", url])
    return status, out.getvalue() + err.getvalue()


IMPORTED_FIELDS = [
    "device.name",
    "device.driver_version",
    "device.cuda_version",
    "study",
    "decision",
    "torch_version",
    "cudnn_version",
    "regime",
]


@pytest.mark.parametrize("kind", HOSTILE)
@pytest.mark.parametrize("field", IMPORTED_FIELDS)
def test_imported_text_a_terminal_would_act_on_is_refused_by_entry_and_field(
    url: str,
    tmp_path: Path,
    field: str,
    kind: str,
    fault_summary: Callable[[dict[str, Any]], None],
) -> None:
    entry = export_entry()
    where, _, name = field.rpartition(".")
    (entry[where] if where else entry)[name] = HOSTILE[kind]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(export_doc([entry])))
    status, said = _run(["import", str(path)], url)
    listed = _run(["list"], url)[1]
    fault_summary(
        {
            "case": f"imported {field} with a {kind}",
            "backend": create_engine(url).dialect.name,
            "status": status,
            "said": said.strip()[:160],
        }
    )
    assert status == 2, said
    assert any(
        line.strip().startswith(f"entry #0: {name} must be printable text")
        for line in said.splitlines()
    ), said
    assert not RAW.search(said), said
    assert "0 tuned problems" in listed


# columns another program may write (a database edited or shared), and what prints them
WRITTEN = [
    ("best_configs", "decision", "id = 1", BEST_ARGS),
    ("best_configs", "torch_version", "id = 1", BEST_ARGS),
    ("best_configs", "regime", "id = 1", BEST_ARGS),
    ("best_configs", "source", "id = 1", ["list"]),
    ("devices", "name", "id = 1", ["list"]),
    ("work_items", "worker", "id = 1", ["queue"]),
    ("work_items", "message", "id = 1", ["queue"]),
    ("work_items", "device_name", "id = 1", ["queue"]),
    ("runtime_misses", "device_name", "id = 1", ["misses"]),
    ("runtime_misses", "path", "id = 1", ["misses"]),
]


@pytest.mark.parametrize("kind", [k for k in HOSTILE if k != "NUL"])
@pytest.mark.parametrize(
    ("table", "column", "where", "command"), WRITTEN, ids=[f"{t}.{c}" for t, c, _, _ in WRITTEN]
)
def test_stored_text_is_printed_escaped(
    url: str,
    table: str,
    column: str,
    where: str,
    command: list[str],
    kind: str,
    fault_summary: Callable[[dict[str, Any]], None],
) -> None:
    _populate(url)
    engine = create_engine(url)
    with engine.begin() as c:
        c.execute(
            text(f"update {table} set {column} = :value where {where}"), {"value": HOSTILE[kind]}
        )
    engine.dispose()
    status, said = _run(command, url)
    fault_summary(
        {
            "case": f"stored {table}.{column} with a {kind}, printed by {command[0]}",
            "backend": engine.dialect.name,
            "status": status,
            "raw": [m.group() for m in RAW.finditer(said)][:4],
        }
    )
    assert status in (0, 1)
    assert not RAW.search(said), said


def test_nul_is_refused_alike_by_every_database(url: str) -> None:
    """PostgreSQL's text cannot hold a NUL: every database refuses it, before it is sent."""
    store = TuningStore(url)
    result = TrialResult(Config.from_dict(sm80_config()), Status.OK, median_us=400.0)
    with pytest.raises(ValueError, match="measurements.study cannot hold the NUL character"):
        store.record_trial(
            H200, PROBLEMS[0], result, build=None, study="s\x00", phase="search", baseline_us=None
        )
    # a lookup by it, before any write: refused as it is sent
    with pytest.raises(ValueError, match="cannot hold the NUL character"):
        store.record_trial(
            H200.__class__("NVIDIA\x00", 90, 132, "580", "13.0"),
            PROBLEMS[0],
            result,
            build=None,
            study="s",
            phase="search",
            baseline_us=None,
        )
    assert store.trials() == []
