"""A killed `tune` leaves nothing behind that a later session cannot settle: each trial records
the host and process running it; trials of a process that is gone (same host, dead pid) are
failed with the reason, or told the value that was already measured; a live process's trials
are never touched; a resumed piece completes the interrupted study's budget."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune._process import Owner, is_gone, this_process
from autotune.cli.main import main
from autotune.store.repo import TuningStore
from autotune.tune.backends import ReplayBackend
from autotune.tune.search import SearchSettings, study_name, tune_problem

REPO = Path(__file__).resolve().parents[2]
RECORDING = REPO / "tests" / "data" / "sweep_sm80_h200.json"
TRIALS = 12
EVALUATED = ("ok", "failed_validation", "crashed", "timeout", "compile_error", "error")


def kill_a_session(url: str, where: str, n: int) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.faults.killed_session", url, where, str(n), str(TRIALS)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]


def study(url: str) -> optuna.Study:
    backend = ReplayBackend(RECORDING)
    return optuna.load_study(
        study_name=study_name(backend.device(), "sm80", backend.problems[0]), storage=url
    )


def running(url: str) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study(url).trials if t.state == TrialState.RUNNING]


def evaluated(url: str) -> int:
    return len([t for t in study(url).trials if t.user_attrs.get("status") in EVALUATED])


def resume(url: str, **settings: object) -> None:
    backend = ReplayBackend(RECORDING)
    tune_problem(
        backend.problems[0],
        backend,
        TuningStore(url),
        SearchSettings(trials=TRIALS, seed=8, warm_start=0, **settings),
    )  # type: ignore[arg-type]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/t.db"


def test_trials_record_their_host_and_process(url: str) -> None:
    kill_a_session(url, "evaluate", 6)
    trials = [t for t in study(url).trials if t.user_attrs.get("digest")]
    assert trials and all(
        t.user_attrs["owner"]["host"] == socket.gethostname()
        and isinstance(t.user_attrs["owner"]["pid"], int)
        for t in trials
    )


def test_a_dead_process_trials_are_failed_with_the_reason(url: str) -> None:
    kill_a_session(url, "evaluate", 6)
    left = running(url)
    assert left, "the kill left no RUNNING trial (the test proves nothing)"
    resume(url)
    assert running(url) == []
    settled = {t.number: t for t in study(url).trials}
    for trial in left:
        after = settled[trial.number]
        assert after.state == TrialState.FAIL
        assert after.user_attrs["status"] == "interrupted"
        assert f"pid {trial.user_attrs['owner']['pid']}" in after.user_attrs["reason"]


def test_a_trial_measured_but_never_told_is_told_its_value(url: str) -> None:
    kill_a_session(url, "recorded", 3)
    (left,) = [
        t for t in running(url) if t.user_attrs["digest"] in {r for r in measured_digests(url)}
    ]
    resume(url)
    after = study(url).trials[left.number]
    assert after.state == TrialState.COMPLETE and after.value is not None
    assert after.user_attrs["status"] == "ok"


def measured_digests(url: str) -> list[str]:
    from autotune.model.config import Config

    return [Config.from_dict(t["config"]).digest for t in TuningStore(url).trials()]


def test_a_live_process_trials_are_never_touched(url: str) -> None:
    resume(url)
    mine = study(url).ask()
    mine.set_user_attr("owner", {"host": socket.gethostname(), "pid": os.getpid()})
    elsewhere = study(url).ask()
    elsewhere.set_user_attr("owner", {"host": "another-host", "pid": 2**22 + 7})
    resume(url)
    states = {t.number: t.state for t in study(url).trials}
    assert states[mine.number] == states[elsewhere.number] == TrialState.RUNNING


def test_skip_tuned_completes_the_interrupted_budget(url: str) -> None:
    kill_a_session(url, "evaluate", 6)
    before = evaluated(url)
    assert 0 < before < TRIALS
    rc = main(
        [
            "tune",
            "--replay",
            str(RECORDING),
            "--batch",
            "4",
            "--heads-q",
            "16",
            "--seqlen-q",
            "2048",
            "--head-dim",
            "128",
            "--trials",
            str(TRIALS),
            "--skip-tuned",
            "--quiet",
            "--db",
            url,
        ]
    )
    assert rc == 0
    assert evaluated(url) == TRIALS
    # a plain `tune` again adds --trials new ones, as docs/tuning.md says
    assert (
        main(
            [
                "tune",
                "--replay",
                str(RECORDING),
                "--batch",
                "4",
                "--heads-q",
                "16",
                "--seqlen-q",
                "2048",
                "--head-dim",
                "128",
                "--trials",
                "3",
                "--quiet",
                "--db",
                url,
            ]
        )
        == 0
    )
    assert evaluated(url) == TRIALS + 3


def test_a_process_is_gone_only_when_surely_gone() -> None:
    me = this_process()
    assert not is_gone(me)
    assert not is_gone(Owner("another-host", 2**22 + 7, None))  # never judged from here
    assert is_gone(Owner(me.host, 2**22 + 7, None))  # no such pid
    if me.started is not None:  # the pid reused by a later process
        assert is_gone(Owner(me.host, me.pid, me.started - 1))
