"""Optuna's database storage, with every trial owned from the instant it runs.

A trial becomes RUNNING in one of two transactions: a new trial asked of the sampler (the
storage's trial creation) or a queued one taken off the queue (WAITING -> RUNNING). This
storage writes, inside that same transaction, the trial's owner (the user attribute "owner":
this process, `_process.this_process`) and its first heartbeat. So no RUNNING trial is ever
without an owner and a heartbeat, however its process dies: the next session of its study
settles it (tune.study: its owner gone on this host, or its heartbeat stale from any host),
never leaving it RUNNING. (Setting the owner in a transaction of its own after Optuna's ask
left trials of processes killed in between RUNNING with neither.)

Trials written whole (`add_trial`: COMPLETE or FAIL, or WAITING when queued) are not running
and get nothing here.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from optuna.storages import RDBStorage
from optuna.storages._rdb import models
from optuna.storages._rdb.storage import _create_scoped_session
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import IntegrityError

from .._process import OWNER_ATTR, this_process


def _own(session: Any, trial_id: int) -> None:
    """The owner and a first heartbeat of a trial made RUNNING in `session`'s transaction."""
    session.add(
        models.TrialUserAttributeModel(
            trial_id=trial_id, key=OWNER_ATTR, value_json=json.dumps(this_process().as_json())
        )
    )
    session.add(models.TrialHeartbeatModel(trial_id=trial_id))


class OwnedTrialsStorage(RDBStorage):
    """RDBStorage whose RUNNING trials are owned from the transaction that makes them so."""

    def _get_prepared_new_trial(
        self, study_id: int, template_trial: FrozenTrial | None, session: Any
    ) -> Any:
        trial = super()._get_prepared_new_trial(study_id, template_trial, session)
        if template_trial is None:  # asked: RUNNING from now (a template is a whole trial)
            _own(session, trial.trial_id)
        return trial

    def set_trial_state_values(self, trial_id: int, state: TrialState, values: Any = None) -> bool:
        if state != TrialState.RUNNING:
            return bool(super().set_trial_state_values(trial_id, state, values))
        # A queued trial taken to run: RDBStorage's own steps for this case (it takes only a
        # WAITING trial; another process may have taken it first), with the owner added.
        try:
            with _create_scoped_session(self.scoped_session) as session:
                trial = models.TrialModel.find_or_raise_by_id(trial_id, session, for_update=True)
                if trial.state != TrialState.WAITING:
                    return False
                trial.state = TrialState.RUNNING
                trial.datetime_start = datetime.now()
                _own(session, trial_id)
        except IntegrityError:
            return False
        return True
