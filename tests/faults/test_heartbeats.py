"""A trial's process on another host cannot be asked whether it runs: its heartbeat says so.
Each process beats for the trials it asked and has not told; the next session that opens the
study settles a trial whose last beat is older than the grace period (by the database's
clock), whatever host it came from, and leaves a beating one alone."""

from __future__ import annotations

import time
from pathlib import Path

import optuna
import pytest

from autotune.measure.records import DeviceInfo
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.store.repo import TuningStore
from autotune.tune import study as study_module
from autotune.tune.settings import SearchSettings
from autotune.tune.strategies import sampler_for
from autotune.tune.study import Study

PROBLEM = Problem(4, 16, 16, 2048, 2048, 128, "fp16", False)
H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")


def _study(url: str) -> Study:
    return Study(
        "s",
        url,
        sampler_for(SearchSettings(sampler="random")),
        load_space("sm80"),
        PROBLEM.space_values(),
    )


def test_a_silent_trial_of_another_host_is_settled_and_a_beating_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(study_module, "HEARTBEAT_S", 1)
    monkeypatch.setattr(study_module, "GRACE_S", 2)
    monkeypatch.setattr(study_module, "_heartbeats", study_module._Heartbeats())
    url = f"sqlite:///{tmp_path}/h.db"
    store = TuningStore(url)
    first = _study(url)
    silent, beating = first.ask(), first.ask()
    for proposal in (silent, beating):  # both "on another host": is_gone never judges them
        first._running[proposal.number].set_user_attr(
            "owner", {"host": "another-host", "pid": 2**22 + 7, "started": None}
        )
    # the silent one's process stops beating (as if it, or its host, died)
    study_module._heartbeats.remove(first._running[silent.number]._trial_id)
    time.sleep(4.5)
    _study(url).settle_abandoned(store, H200, PROBLEM)
    trials = {t.number: t for t in optuna.load_study(study_name="s", storage=url).trials}
    settled = trials[silent.number]
    assert settled.state == optuna.trial.TrialState.FAIL
    assert settled.user_attrs["status"] == "interrupted"
    assert "heartbeat" in settled.user_attrs["reason"]
    assert "another-host" in settled.user_attrs["reason"]
    assert trials[beating.number].state == optuna.trial.TrialState.RUNNING


def test_a_told_trial_stops_beating(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.model.status import Status
    from autotune.tune.study import Outcome

    beats = study_module._Heartbeats()
    monkeypatch.setattr(study_module, "_heartbeats", beats)
    study = _study(f"sqlite:///{tmp_path}/h.db")
    proposal = study.ask()
    assert len(beats._trials) == 1
    study.tell(proposal, Outcome(Status.OK, 100.0))
    assert beats._trials == {}


def test_a_trial_whose_process_died_before_naming_itself_is_settled_by_age(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed between Optuna's ask and its own name on the trial leaves a RUNNING
    trial with no owner: settled once it is older than ORPHAN_S (a live process names itself
    within milliseconds); a younger one is left alone."""
    url = f"sqlite:///{tmp_path}/h.db"
    store = TuningStore(url)
    _study(url)  # creates the study
    raw = optuna.load_study(study_name="s", storage=url)
    orphan = raw.ask()  # no owner, no heartbeat: the kill landed right after the ask
    _study(url).settle_abandoned(store, H200, PROBLEM)
    assert raw.trials[orphan.number].state == optuna.trial.TrialState.RUNNING  # too young
    monkeypatch.setattr(study_module, "ORPHAN_S", 0)
    _study(url).settle_abandoned(store, H200, PROBLEM)
    settled = optuna.load_study(study_name="s", storage=url).trials[orphan.number]
    assert settled.state == optuna.trial.TrialState.FAIL
    assert "naming itself" in settled.user_attrs["reason"]
