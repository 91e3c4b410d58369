"""No trial is left RUNNING by a killed process (issue 37, item 2).

A trial's owner and first heartbeat are written in the transaction that makes it RUNNING
(tune.owned_trials), whether it is asked of the sampler or taken off the study's queue. So a
process killed (SIGKILL) at any instant, even between Optuna's ask and anything of ours, leaves
only RUNNING trials that name their owner, and the next session of the study settles every one
at once, by the owner's death (no wait for an age or a stale heartbeat). Before, the owner was
set in a transaction of its own after the ask: a kill in between left a trial with neither
owner nor heartbeat.
"""

from __future__ import annotations

import os
import random
import select
import signal
import time
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

import optuna
import pytest
from sqlalchemy import create_engine, text

from autotune.measure.records import DeviceInfo
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.model.status import Status
from autotune.store.repo import TuningStore
from autotune.tune.settings import SearchSettings
from autotune.tune.strategies import sampler_for
from autotune.tune.study import Outcome, Study, optuna_storage
from tests.faults.kill_during_create import in_child

PROBLEM = Problem(4, 16, 16, 2048, 2048, 128, "fp16", False)
H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
KILLS = int(os.environ.get("CUTE_AUTOTUNE_ORPHAN_KILLS", "16"))


def _study(url: str) -> Study:
    return Study(
        "s",
        url,
        sampler_for(SearchSettings(sampler="random")),
        load_space("sm80"),
        PROBLEM.space_values(),
    )


def _running(url: str) -> dict[str, int]:
    """RUNNING trials of the study, with and without an owner attribute and a heartbeat."""
    engine = create_engine(url)
    try:
        with engine.connect() as c:

            def count(where: str) -> int:
                return int(
                    c.execute(
                        text("SELECT COUNT(*) FROM trials t WHERE t.state = 'RUNNING' " + where)
                    ).scalar_one()
                )

            return {
                "running": count(""),
                "without_an_owner": count(
                    "AND NOT EXISTS (SELECT 1 FROM trial_user_attributes a WHERE a.trial_id = "
                    "t.trial_id AND a.key = 'owner')"
                ),
                "without_a_heartbeat": count(
                    "AND NOT EXISTS (SELECT 1 FROM trial_heartbeats h WHERE h.trial_id = "
                    "t.trial_id)"
                ),
            }
    finally:
        engine.dispose()


def _ask_and_tell_forever(url: str, ready: int) -> None:
    """A tuning session: configs queued and asked from the sampler, each told at once. Writes
    to `ready` once its study is open, so that the kill lands in the asks and tells."""
    study = _study(url)
    rng = random.Random(os.getpid())
    configs = list(islice(load_space("sm80").all_configs(PROBLEM.space_values()), 40))
    os.write(ready, b"1")
    while True:
        if rng.random() < 0.5:
            study.enqueue([rng.choice(configs)])
        proposal = study.ask()
        study.tell(proposal, Outcome(Status.OK, rng.uniform(50.0, 100.0)))


def _killed_while_tuning(url: str, after_s: float) -> None:
    """A forked session killed (SIGKILL) `after_s` seconds after its study is open."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        try:
            _ask_and_tell_forever(url, write_end)
        finally:
            os._exit(1)
    os.close(write_end)
    try:
        readable, _, _ = select.select([read_end], [], [], 120)
        assert readable and os.read(read_end, 1) == b"1", "the session did not open its study"
        time.sleep(after_s)
    finally:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(read_end)
    assert os.WIFSIGNALED(status), "the session ended by itself"


def _make(url: str) -> None:
    TuningStore(url)
    _study(url)


def _kill_rounds(url: str) -> dict[str, Any]:
    # The study made before the first session (its kills land in the asks), in a child of its
    # own: a forked child must not inherit this process's pooled connections.
    _, error, _ = in_child(_make, url)
    assert not error, error
    rng = random.Random(int(os.environ.get("KILL_SEED", "1")))
    for _ in range(KILLS):
        _killed_while_tuning(url, rng.uniform(0.0, 0.5))
    left = _running(url)
    _study(url).settle_abandoned(TuningStore(url), H200, PROBLEM)  # the next session
    after = _running(url)
    told = optuna.load_study(study_name="s", storage=url).trials
    return {
        "kills": KILLS,
        "trials": len(told),
        "running_after_the_kills": left["running"],
        "running_without_an_owner": left["without_an_owner"],
        "running_without_a_heartbeat": left["without_a_heartbeat"],
        "left_running_after_the_next_session": after["running"],
    }


def _check(result: dict[str, Any]) -> None:
    assert result["running_without_an_owner"] == 0, result
    assert result["running_without_a_heartbeat"] == 0, result
    assert result["left_running_after_the_next_session"] == 0, result


def test_sessions_killed_at_random_leave_no_trial_running_on_sqlite(
    tmp_path: Path, fault_summary: Callable[[dict[str, Any]], None]
) -> None:
    result = _kill_rounds(f"sqlite:///{tmp_path}/orphans.db")
    fault_summary(
        {
            "case": "sqlite: tuning sessions killed at random instants of ask and tell, "
            "then the next session",
            "backend": "sqlite",
            **result,
        }
    )
    _check(result)


@pytest.mark.postgres
def test_sessions_killed_at_random_leave_no_trial_running_on_postgres(
    postgres_url: str, fault_summary: Callable[[dict[str, Any]], None]
) -> None:
    result = _kill_rounds(postgres_url)
    fault_summary(
        {
            "case": "postgresql: tuning sessions killed at random instants of ask and "
            "tell, then the next session",
            "backend": "postgresql",
            **result,
        }
    )
    _check(result)


@pytest.mark.parametrize("path", ["asked", "queued"])
def test_a_trial_is_owned_by_the_transaction_that_makes_it_running(
    tmp_path: Path, path: str
) -> None:
    """The storage alone, with nothing of ours after it (as if killed right after): the trial
    names its owner and has a heartbeat."""
    url = f"sqlite:///{tmp_path}/owned.db"
    TuningStore(url)
    _study(url)
    storage = optuna_storage(url)
    study_id = storage.get_study_id_from_name("s")
    if path == "asked":
        trial_id = storage.create_new_trial(study_id)
    else:
        raw = optuna.load_study(study_name="s", storage=storage)
        raw.enqueue_trial({})
        trial_id = next(
            t._trial_id
            for t in raw.get_trials(deepcopy=False)
            if t.state == optuna.trial.TrialState.WAITING
        )
        assert storage.set_trial_state_values(trial_id, optuna.trial.TrialState.RUNNING)
        # taken once: another process asking for it now finds it taken
        assert not storage.set_trial_state_values(trial_id, optuna.trial.TrialState.RUNNING)
    assert _running(url) == {"running": 1, "without_an_owner": 0, "without_a_heartbeat": 0}
    owner = storage.get_trial(trial_id).user_attrs["owner"]
    assert owner["pid"] == os.getpid()


def test_a_trial_made_by_an_ask_whose_connection_broke_is_settled_by_its_own_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transaction that made the trial RUNNING committed, the answer never came back (a
    broken connection): the process is alive and never learnt the trial's id. Once it has
    given up its running trials (worker: abandon_running), its next session settles that
    trial; before, it is a live process's trial and left alone."""
    from autotune.tune import study as study_module

    monkeypatch.setattr(study_module, "_abandoned", set())
    monkeypatch.setattr(study_module, "_connection_broke", False)
    url = f"sqlite:///{tmp_path}/lost.db"
    store = TuningStore(url)
    _study(url)
    storage = optuna_storage(url)
    trial_id = storage.create_new_trial(storage.get_study_id_from_name("s"))  # the lost ask
    _study(url).settle_abandoned(store, H200, PROBLEM)
    assert storage.get_trial(trial_id).state == optuna.trial.TrialState.RUNNING
    study_module.abandon_running()
    _study(url).settle_abandoned(store, H200, PROBLEM)
    settled = storage.get_trial(trial_id)
    assert settled.state == optuna.trial.TrialState.FAIL
    assert "while asking it" in settled.user_attrs["reason"]
