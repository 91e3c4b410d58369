"""An item handed over while its old holder still runs (its lease ran out on a loaded machine,
tune.worker): the two sessions share the study's queue for a moment. The new holder builds its
grid from the queue as it finds it; the old one, not yet aware that it lost the item, can still
take the next queued config off that queue, then give it up, told "interrupted" (what it tells
on LeaseLost) or left RUNNING (it was killed meanwhile). The new holder must measure that config
all the same: every valid config measured once, none lost, none twice.

Seen once in the 8-worker kill rounds (tests/faults/test_fault_rounds.py): 801 of the 802
search measurements, the lost config's only trial told "interrupted" by a worker whose lease
had run out, after the item's new holder had counted it among its queue.

An old holder killed after it stored the config's outcome (a time, or a failure of the config)
but before it told the study: the new holder settles that trial with the stored outcome and
does not measure the config again. Queued again as lost, a stored failure was measured twice
(the loop's store lookup reuses times only)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import create_engine, text

from autotune._process import Owner
from autotune.build.compiler import BuildResult
from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.model.status import Status
from autotune.store.records import TrialResult
from autotune.store.repo import TuningStore
from autotune.tune import study as study_module
from autotune.tune.backends import ReplayBackend
from autotune.tune.search import SearchSettings, study_name, tune_problem
from autotune.tune.strategies import sampler_for
from autotune.tune.study import Outcome, Proposal, Study

from .killed_session import INJECTED, failing_validation

RECORDING = Path(__file__).resolve().parents[2] / "tests" / "data" / "sweep_sm80_h200.json"
GRID: dict[str, Any] = {
    "sampler": "grid",
    "rerank_top": 1,
    "warm_start": 0,
    "sdpa_finalists": False,
}
BEFORE = 10  # configs the old holder measured before its lease ran out


class Handover(ReplayBackend):
    """The new holder's backend: at its first timing (its grid is built by then), the old
    holder takes the next config off the study's queue and gives it up (`how`): told
    "interrupted", or killed (left RUNNING) before it ran it, or killed after it stored the
    config's time ("killed after a time") or failure ("killed after a failure")."""

    def __init__(self, url: str, how: str) -> None:
        super().__init__(RECORDING)
        self.url, self.how = url, how
        self.taken: Config | None = None
        self.taken_as: int | None = None  # the number of the old holder's trial of it

    def evaluate(self, problem: Problem, build: BuildResult, **kwargs: Any) -> TrialResult:
        if self.taken is None:
            old = Study(
                study_name(self.device(), "sm80", problem),
                self.url,
                sampler_for(SearchSettings(**GRID)),
                load_space("sm80"),
                problem.space_values(),
            )
            proposal = old.ask()
            self.taken, self.taken_as = proposal.config, proposal.number
            if self.how == "interrupted":
                old.tell(
                    proposal, Outcome(Status.INTERRUPTED, reason="the session stopped: LeaseLost")
                )
            else:
                if self.how != "killed":
                    self._store_outcome(old, proposal, problem, **kwargs)
                _kill(old, proposal)
        return super().evaluate(problem, build, **kwargs)

    def _store_outcome(
        self, old: Study, proposal: Proposal, problem: Problem, **kwargs: Any
    ) -> None:
        """What the loop does for a timed config before it tells the study."""
        [build] = self.build([proposal.config])
        result = super().evaluate(problem, build, **kwargs)
        if self.how == "killed after a failure":
            result = failing_validation(result)
        old.note_build(proposal, build.key)
        TuningStore(self.url).record_trial(
            self.device(),
            problem,
            result,
            build=build,
            study=old.name,
            phase="search",
            baseline_us=None,
        )


def _kill(old: Study, proposal: Proposal) -> None:
    """The old holder killed while running `proposal`: its trial stays RUNNING, its heartbeat
    stops and its process is gone."""
    trial = old._running[proposal.number]
    study_module._heartbeats.remove(trial._trial_id)
    trial.set_user_attr("owner", Owner(socket.gethostname(), 2**22 + 7, None).as_json())


def _search_measurements(url: str) -> list[str]:
    with create_engine(url).connect() as c:
        return [
            digest
            for (digest,) in c.execute(
                text(
                    "select k.digest from measurements m join kernel_configs k "
                    "on k.id = m.config_id where m.phase = 'search'"
                )
            )
        ]


def _hand_over(tmp_path: Path, how: str) -> tuple[Handover, set[str], list[str]]:
    """The old holder's session so far, then the new holder's: its backend, the valid
    configs, and the digest of every search measurement stored."""
    url = f"sqlite:///{tmp_path}/h.db"
    store = TuningStore(url)
    backend = Handover(url, how)
    problem = backend.problems[0]
    valid = {
        c.digest
        for c in load_space("sm80").valid_configs(backend.target(), problem.space_values())
    }
    # the old holder's session so far: BEFORE configs measured, the rest of the grid queued
    tune_problem(problem, ReplayBackend(RECORDING), store, SearchSettings(trials=BEFORE, **GRID))
    assert len(_search_measurements(url)) == BEFORE
    # the new holder resumes the item (tune.worker: resume) with the whole grid as budget
    tune_problem(problem, backend, store, SearchSettings(trials=len(valid), resume=True, **GRID))
    assert backend.taken is not None and backend.taken.digest in valid
    return backend, valid, _search_measurements(url)


@pytest.mark.parametrize("how", ["interrupted", "killed"])
def test_a_config_the_old_holder_takes_off_the_queue_and_gives_up_is_measured(
    tmp_path: Path, how: str
) -> None:
    backend, valid, measured = _hand_over(tmp_path, how)
    assert backend.taken is not None
    assert backend.taken.digest in measured, "the config the old holder gave up was lost"
    assert sorted(measured) == sorted(valid)  # each valid config once: none lost, none twice


@pytest.mark.parametrize(
    ("how", "state", "status"),
    [
        ("killed after a failure", TrialState.FAIL, "failed_validation"),
        ("killed after a time", TrialState.COMPLETE, "ok"),
    ],
    ids=["failure", "time"],
)
def test_a_config_whose_outcome_the_killed_old_holder_stored_is_not_measured_again(
    tmp_path: Path, how: str, state: TrialState, status: str
) -> None:
    backend, valid, measured = _hand_over(tmp_path, how)
    assert backend.taken is not None and backend.taken_as is not None
    assert measured.count(backend.taken.digest) == 1, (
        f"the config the killed old holder stored ({how}) was measured again"
    )
    assert sorted(measured) == sorted(valid)  # each valid config once: none lost, none twice
    # its trial settled mid-session with the stored outcome, not left RUNNING
    name = study_name(backend.device(), "sm80", backend.problems[0])
    after = optuna.load_study(study_name=name, storage=backend.url).trials[backend.taken_as]
    assert (after.state, after.user_attrs.get("status")) == (state, status)
    if state == TrialState.FAIL:
        assert INJECTED in after.user_attrs["reason"]
