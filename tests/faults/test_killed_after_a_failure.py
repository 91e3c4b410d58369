"""A session killed (SIGKILL) between storing a failed measurement (the config ran and failed
validation: a result, not OK) and telling the study leaves its trial RUNNING. The next session
must settle that trial with the stored failure, as it settles one whose stored measurement has
a time, and not measure the config again: every valid config measured once, none twice.

Settled "interrupted" instead (the store's lookup found only timed rows), the trial said
nothing of the config: the resumed grid queued it again and the store ended with two failed
measurements of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState
from sqlalchemy import create_engine, text

from autotune.model.space import load_space
from autotune.store.repo import TuningStore
from autotune.tune.backends import ReplayBackend
from autotune.tune.search import SearchSettings, study_name, tune_problem

from .killed_session import INJECTED

REPO = Path(__file__).resolve().parents[2]
RECORDING = REPO / "tests" / "data" / "sweep_sm80_h200.json"
GRID: dict[str, Any] = {
    "sampler": "grid",
    "rerank_top": 1,
    "warm_start": 0,
    "sdpa_finalists": False,
}


def _search_rows(url: str) -> list[tuple[str, str, str | None]]:
    """(digest, status, reason) of every search measurement stored."""
    with create_engine(url).connect() as c:
        return [
            (d, s, r)
            for d, s, r in c.execute(
                text(
                    "select k.digest, m.status, m.reason from measurements m "
                    "join kernel_configs k on k.id = m.config_id where m.phase = 'search'"
                )
            )
        ]


def test_a_failure_stored_but_never_told_is_told_and_not_measured_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    # the first session: its first timed config fails validation; killed right after that
    # failure is stored, before Optuna is told (the rest of its batch is left RUNNING, unrun)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.faults.killed_session", url, "failed", "1", "12"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    [(failed, status, reason)] = _search_rows(url)
    assert (status, reason) == ("failed_validation", INJECTED)

    backend = ReplayBackend(RECORDING)
    problem = backend.problems[0]
    study = optuna.load_study(
        study_name=study_name(backend.device(), "sm80", problem), storage=url
    )
    [left] = [
        t
        for t in study.trials
        if t.state == TrialState.RUNNING and t.user_attrs["digest"] == failed
    ]

    # the item resumed (tune.worker: resume) with the whole grid as budget
    valid = {
        c.digest
        for c in load_space("sm80").valid_configs(backend.target(), problem.space_values())
    }
    tune_problem(
        problem, backend, TuningStore(url), SearchSettings(trials=len(valid), resume=True, **GRID)
    )

    measured = [digest for digest, _, _ in _search_rows(url)]
    assert measured.count(failed) == 1, "the config whose failure was stored ran again"
    assert sorted(measured) == sorted(valid)  # each valid config once: none lost, none twice
    after = study.trials[left.number]
    assert after.state == TrialState.FAIL
    assert after.user_attrs["status"] == "failed_validation"
    assert INJECTED in after.user_attrs["reason"]
