"""The record of one kernel family's search for one problem: an Optuna study in the store's
database, outliving the session that writes it.

Every trial names the process running it (`owner`), the config it asked for (`digest`,
`config`), the build it measured (`build_key`) and how it ended (`status`, a `Status`, and a
`reason` when it has no value). A strategy asks its configs here and tells their outcomes here;
the loop reads what earlier sessions learnt. Nothing here compiles, times or picks a config.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .._process import OWNER_ATTR, Owner, is_gone, this_process
from ..model.config import Config, InvalidConfig, Value
from ..model.problem import Problem
from ..model.space import Space
from ..model.status import Status
from ..store.records import DeviceInfo
from ..store.repo import TuningStore
from ..store.schema import schema_lock, sqlite_immediate_writes

# The objective every study minimises: a config's median time in microseconds. Optuna's trial
# count of a study is larger than the CLI's "trials": it also holds configs pruned before they
# were built and repeats (a config proposed again is told its earlier value, status "repeat").
OBJECTIVE = "median_us"

# Outcomes that say nothing of the config: neither counted as trials of the study nor held
# against the config (None: a trial that never ended, or was asked outside the search). Stored
# attributes are plain strings; a Status compares equal to its string.
NOT_COUNTED: tuple[Status | None, ...] = (
    None,
    Status.INVALID,
    Status.REPEAT,
    Status.INTERRUPTED,
    Status.INFRASTRUCTURE,
)


@dataclass(frozen=True)
class Proposal:
    """A config a strategy asked for: trial `number` of the study, running until told."""

    number: int
    config: Config


@dataclass(frozen=True)
class Outcome:
    """How a proposal ended. `value` (median us) when it has one; `pruned` when the space's
    constraints refused it before it was built (told to Optuna as PRUNED, not as a failure)."""

    status: Status
    value: float | None = None
    reason: str = ""
    pruned: bool = False

    @property
    def measured(self) -> bool:
        """Whether this says how the config runs under today's build: its time, or (value
        None) that it fails. A repeat adds nothing; the machinery's failure and an interrupt
        say nothing of the config; a pruned config was never run."""
        return not self.pruned and self.status not in (
            Status.REPEAT,
            Status.INFRASTRUCTURE,
            Status.INTERRUPTED,
        )


@dataclass(frozen=True)
class Knowledge:
    """What a study already holds, for the session that opens it."""

    # By config digest: its value (median us), or None for a failure of the build made today
    # (a failure under another toolchain or kernel is worth trying again).
    known: Mapping[str, float | None]
    ran_today: int  # trials of today's builds that evaluated a config: what a resume keeps
    best_us: float | None
    builds_today: int = 0  # distinct builds among those trials (configs differing only in
    # launch parameters share one): what a resume keeps when launch values are swept


class Study:
    """One family's Optuna study for one problem (created on first use), with the space its
    trials' parameters come from. `url` None keeps it in memory (tests of strategies)."""

    def __init__(
        self, name: str, url: str | None, sampler: Any, space: Space, fixed: Mapping[str, Value]
    ) -> None:
        import optuna
        from optuna.distributions import BaseDistribution, CategoricalDistribution

        self.name = name
        self.space = space
        self.fixed = dict(fixed)
        self._storage = optuna_storage(url)
        self._study = optuna.create_study(
            study_name=name,
            storage=self._storage,
            direction="minimize",
            sampler=sampler,
            load_if_exists=True,
        )
        if self._study.metric_names is None:
            # Optuna's dashboard and exports name the objective by this
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                self._study.set_metric_names([OBJECTIVE])
        self._distributions: dict[str, BaseDistribution] = {
            p.name: CategoricalDistribution(list(p.values)) for p in space.tunable_params
        }
        self._running: dict[int, Any] = {}  # asked here and not told yet: number -> Trial

    # -- what earlier sessions left --------------------------------------------------------

    def settle_abandoned(self, store: TuningStore, device: DeviceInfo, problem: Problem) -> None:
        """Settle the RUNNING trials of processes that are gone (same host, dead pid) or silent
        (no heartbeat for GRACE_S seconds, any host), and those this process abandoned when
        its database connection broke (`abandon_running`): told the outcome their process
        already stored in the database (a value, or the config's failure), else failed as
        "interrupted" with the reason. A trial of a live process (beating, or on this host and
        running) is never touched."""
        import optuna
        from optuna.trial import TrialState

        study = self._study
        stale, now = self._stale_ids(), datetime.now()
        for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            owner = Owner.from_json(frozen.user_attrs.get(OWNER_ATTR))
            why = self._left_behind(frozen, owner, stale, now)
            if why is None:
                continue
            try:
                self._settle(study, frozen, owner, why, store, device, problem)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # another session settled it first

    def _stale_ids(self) -> set[int]:
        """Ids of the study's RUNNING trials whose last heartbeat is older than GRACE_S, by
        the database's clock (none in memory: no heartbeats)."""
        if self._storage is None:
            return set()
        return set(self._storage._get_stale_trial_ids(self._study._study_id))

    @staticmethod
    def _left_behind(
        frozen: Any, owner: Owner | None, stale: set[int], now: datetime
    ) -> str | None:
        """Why no process runs this RUNNING trial (of `owner`) any more, or None while its
        process may still run it. `stale`: `_stale_ids()`; `now`: local time, as Optuna stamps
        a trial's start."""
        if frozen._trial_id in _abandoned:
            return "its process lost the database connection while running it"
        if (
            _connection_broke
            and owner == this_process()
            and not _heartbeats.holds(frozen._trial_id)
        ):
            # made RUNNING in the database, in this process's name, by an ask whose
            # connection broke before it returned: no one here runs it
            return "its process lost the database connection while asking it"
        if owner is None:
            # A process names itself on a trial right after asking it: one that has no name
            # long after its start was asked by a process killed in between.
            started = frozen.datetime_start
            if started is None or (now - started).total_seconds() < ORPHAN_S:
                return None
            return (
                f"its process died between asking it (at {started:%Y-%m-%d %H:%M:%S}) "
                "and naming itself on it"
            )
        if is_gone(owner):
            return f"{owner.describe()} died before this trial finished"
        if frozen._trial_id in stale:
            return (
                f"{owner.describe()} sent no heartbeat for more than {GRACE_S} s (the "
                "process or its host died, or lost the database)"
            )
        return None

    @staticmethod
    def _settle(
        study: Any,
        frozen: Any,
        owner: Owner | None,
        why: str,
        store: TuningStore,
        device: DeviceInfo,
        problem: Problem,
    ) -> None:
        """Tell one abandoned trial (`why`: how its process was found gone): the value its
        process stored, or the failure it stored (its status and reason), else "interrupted"
        with that reason."""
        import optuna
        from optuna.trial import TrialState

        # Optuna sets a trial's attributes only through a Trial object; this is its
        # constructor on an existing trial's id (frozen trials expose it privately).
        trial = optuna.trial.Trial(study, frozen._trial_id)
        raw, build_key = frozen.user_attrs.get("config"), frozen.user_attrs.get("build_key")
        measured = failed = None
        if raw and build_key:
            config = Config.from_json(raw)
            measured = store.find_trial(device, problem, config, build_key)
            # A failure it stored is its outcome too: settled "interrupted", the trial would say
            # nothing of the config, and the next session would measure it again (a second row).
            if measured is None:
                failed = store.find_failure(device, problem, config, build_key)
        value = measured.median_us if measured is not None else None
        by = owner.describe() if owner is not None else "a process"
        told = f"which did not tell the study ({why}); told by another session"
        if value is not None:
            trial.set_user_attr("status", Status.OK.value)
            trial.set_user_attr("reason", f"measured by {by}, {told}")
            study.tell(frozen.number, value)
        elif failed is not None:
            trial.set_user_attr("status", failed.status.value)
            trial.set_user_attr("reason", f"{failed.reason[:2000]} (stored by {by}, {told})")
            study.tell(frozen.number, state=TrialState.FAIL)
        else:
            trial.set_user_attr("status", Status.INTERRUPTED.value)
            trial.set_user_attr("reason", why)
            study.tell(frozen.number, state=TrialState.FAIL)

    def knowledge(self, build_key: Callable[[Config], str]) -> Knowledge:
        """What the study knows, judged against the builds `build_key` makes today."""
        from optuna.trial import TrialState

        known: dict[str, float | None] = {}
        ran_today = 0
        builds: set[str] = set()
        best: float | None = None
        for t in self._study.get_trials(deepcopy=False):
            digest, status = t.user_attrs.get("digest"), t.user_attrs.get("status")
            today = _of_current_build(t.user_attrs, build_key)
            if today and status not in (*NOT_COUNTED, Status.REUSED):
                ran_today += 1
                builds.add(t.user_attrs["build_key"])
            if digest and t.state == TrialState.COMPLETE:
                known[digest] = t.value
                if t.value is not None and (best is None or t.value < best):
                    best = t.value
            elif digest and t.state == TrialState.FAIL and status not in NOT_COUNTED and today:
                known.setdefault(digest, None)
        return Knowledge(known, ran_today, best, len(builds))

    # -- asking and telling ------------------------------------------------------------------

    def enqueue(self, configs: Iterable[Config]) -> None:
        """Queue configs to be asked next, each once: one already queued (WAITING) is not
        queued again. (Optuna's skip_if_exists would also skip a config tried before, whose
        failure under an older build, or of the machinery, deserves another try.) The queue is
        stored: what a session leaves queued, the next one asks first."""
        from optuna.trial import TrialState

        tunable = [p.name for p in self.space.tunable_params]
        queued = {
            json.dumps(t.system_attrs.get("fixed_params", t.params), sort_keys=True)
            for t in self._study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        }
        for config in configs:
            params = {name: config[name] for name in tunable}
            key = json.dumps(params, sort_keys=True)
            if key not in queued:
                queued.add(key)
                self._study.enqueue_trial(params)

    def waiting(self) -> int:
        """How many queued configs are still to be asked."""
        from optuna.trial import TrialState

        return len(self._study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def taken(self) -> set[str]:
        """Digests of the configs the study holds as run (a value, or a failure of the config)
        or that a live process is running now. A queued config missing here once the queue is
        empty was taken off it by another session that gave it up: told "interrupted", or left
        RUNNING by a process that is gone (or silent, or abandoned by this one)."""
        from optuna.trial import TrialState

        stale, now = self._stale_ids(), datetime.now()
        taken: set[str] = set()
        for t in self._study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING)
        ):
            digest = t.user_attrs.get("digest")
            if not digest:
                continue
            if t.state == TrialState.RUNNING:
                owner = Owner.from_json(t.user_attrs.get(OWNER_ATTR))
                if self._left_behind(t, owner, stale, now) is None:
                    taken.add(digest)
            elif t.state == TrialState.COMPLETE or t.user_attrs.get("status") not in NOT_COUNTED:
                taken.add(digest)
        return taken

    def ask(self) -> Proposal:
        """The next config: the oldest queued one, else the sampler's."""
        with warnings.catch_warnings():
            # "Heartbeat of storage is supposed to be used with Study.optimize": our own thread
            # beats for the trials we ask (_Heartbeats)
            warnings.filterwarnings("ignore", message="Heartbeat of storage")
            trial = self._study.ask(self._distributions)
        _heartbeats.add(self._storage, trial._trial_id)
        if self._storage is None:  # in memory; a database's storage owned it as it asked
            trial.set_user_attr(OWNER_ATTR, this_process().as_json())
        config = self.space.config(**self.fixed, **trial.params)
        trial.set_user_attr("digest", config.digest)
        trial.set_user_attr("config", config.to_json())
        self._running[trial.number] = trial
        return Proposal(trial.number, config)

    def note_build(self, proposal: Proposal, build_key: str | None) -> None:
        """Name the build a running trial measures, before its measurement is stored: a session
        killed in between leaves a RUNNING trial whose value the next one finds by it."""
        self._running[proposal.number].set_user_attr("build_key", build_key)

    def tell(self, proposal: Proposal, outcome: Outcome) -> None:
        from optuna.trial import TrialState

        trial = self._running.pop(proposal.number)
        trial.set_user_attr("status", outcome.status.value)
        if outcome.value is None:
            trial.set_user_attr("reason", outcome.reason)
        if outcome.pruned:
            self._study.tell(trial, state=TrialState.PRUNED)
        elif outcome.value is None:
            self._study.tell(trial, state=TrialState.FAIL)
        else:
            self._study.tell(trial, outcome.value)
        # Once told, not before: a tell cut off by a broken connection leaves the trial among
        # this process's running ones, for `abandon_running` to give up.
        _heartbeats.remove(trial._trial_id)

    def record(self, config: Config, outcome: Outcome, build_key: str | None) -> None:
        """A trial of `config` measured outside ask and tell (a launch value timed on a build
        the search already made, tune.loop), added to the study whole: complete with its value,
        or failed with its reason. A session killed before this write finds the measurement in
        the store (reused) and adds the trial then."""
        from optuna.trial import TrialState, create_trial

        attrs: dict[str, Any] = {
            OWNER_ATTR: this_process().as_json(),
            "digest": config.digest,
            "config": config.to_json(),
            "build_key": build_key,
            "status": outcome.status.value,
        }
        if outcome.value is None:
            attrs["reason"] = outcome.reason
        params = {p.name: config[p.name] for p in self.space.tunable_params}
        self._study.add_trial(
            create_trial(
                params=params,
                distributions=self._distributions,
                value=outcome.value,
                state=TrialState.COMPLETE if outcome.value is not None else TrialState.FAIL,
                user_attrs=attrs,
            )
        )

    # -- what the study found --------------------------------------------------------------

    def ranked(self) -> list[Config]:
        """The distinct configs of the study that have a value, fastest first."""
        from optuna.trial import TrialState

        ranked: dict[str, tuple[float, Config]] = {}
        for t in self._study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            digest, raw = t.user_attrs.get("digest"), t.user_attrs.get("config")
            if digest and raw and t.value is not None:
                if digest not in ranked or t.value < ranked[digest][0]:
                    ranked[digest] = (t.value, Config.from_json(raw))
        return [config for _, config in sorted(ranked.values(), key=lambda vc: vc[0])]

    def trial_counts(self) -> tuple[int, int]:
        """Trials of the study that evaluated a config (see NOT_COUNTED), and every trial as
        Optuna (and optuna-dashboard) counts them; one read of the study."""
        trials = self._study.get_trials(deepcopy=False)
        return counted(trials), len(trials)


_storages: dict[str, Any] = {}
_storages_lock = threading.Lock()


# A running trial's heartbeat (Optuna's, recorded by our own thread: Optuna beats only inside
# optimize(), and the search asks and tells). A trial whose last beat is older than the grace
# period, by the database's clock, is settled by the next session that opens its study, from
# any host: its process, or its host, died or lost the database.
HEARTBEAT_S = 20
GRACE_S = 120
# A RUNNING trial that names no owner this long after its start was asked by a process of a
# release before tune.owned_trials, killed before it could name itself (a window of
# milliseconds); this release names the owner in the transaction that makes a trial RUNNING.
ORPHAN_S = 60


def optuna_storage(url: str | None) -> Any:
    """Optuna's storage in the tuning database at `url` (None: in memory), one per process,
    with heartbeats. Optuna creates its tables on first use: that happens under the schema
    lock, so processes that open a new database together do not race on it; on SQLite its
    transactions then begin with BEGIN IMMEDIATE like ours (two processes cannot both take one
    queued trial)."""
    if url is None:
        return None
    import optuna
    from sqlalchemy.engine import make_url

    from .owned_trials import OwnedTrialsStorage

    with _storages_lock:
        storage = _storages.get(url)
        if storage is None:
            with schema_lock(url), warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                # A server's pooled connection may have been ended while idle: checked at
                # checkout and replaced, as the tuning store's engine does (schema.make_engine),
                # rather than failing the next trial's transaction.
                server = make_url(url).get_backend_name() != "sqlite"
                storage = OwnedTrialsStorage(
                    url,
                    engine_kwargs={"pool_pre_ping": True} if server else None,
                    heartbeat_interval=HEARTBEAT_S,
                    grace_period=GRACE_S,
                )
            sqlite_immediate_writes(storage.engine)
            _storages[url] = storage
    return storage


class _Heartbeats:
    """One daemon thread per process that records a heartbeat of every trial this process
    has asked and not told, every HEARTBEAT_S seconds (a beat that fails is retried at the
    next one)."""

    def __init__(self) -> None:
        self._trials: dict[int, Any] = {}  # trial id -> its storage
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, storage: Any, trial_id: int) -> None:
        if storage is None:
            return
        self._beat(storage, trial_id)
        with self._lock:
            self._trials[trial_id] = storage
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name="optuna-heartbeats"
                )
                self._thread.start()

    def holds(self, trial_id: int) -> bool:
        with self._lock:
            return trial_id in self._trials

    def remove(self, trial_id: int) -> None:
        with self._lock:
            self._trials.pop(trial_id, None)

    def remove_all(self) -> set[int]:
        with self._lock:
            ids = set(self._trials)
            self._trials.clear()
            return ids

    def _run(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            with self._lock:
                beating = list(self._trials.items())
            for trial_id, storage in beating:
                self._beat(storage, trial_id)

    @staticmethod
    def _beat(storage: Any, trial_id: int) -> None:
        try:
            storage.record_heartbeat(trial_id)
        except Exception:  # told meanwhile, or the database away for a moment
            pass


_heartbeats = _Heartbeats()
# Trials this process asked and gave up (their ids: one database per process, a worker's).
_abandoned: set[int] = set()
# Whether this process's database connection broke mid-search: an ask cut off then may have
# made a trial RUNNING in this process's name that the process never learnt of.
_connection_broke = False


def abandon_running() -> None:
    """Give up every trial this process has asked and not told: its database connection broke
    mid-search, so whether each was told is unknown. Their heartbeats stop, and the next
    session of their study (this process's own, when it runs the work again) settles them as
    it settles a dead process's trials: told the value already stored, else interrupted."""
    global _connection_broke
    _connection_broke = True
    _abandoned.update(_heartbeats.remove_all())


def counted(trials: Sequence[Any]) -> int:
    """Of Optuna trials, those that evaluated a config (see NOT_COUNTED)."""
    return len([t for t in trials if t.user_attrs.get("status") not in NOT_COUNTED])


def counted_trials(url: str, name: str) -> int:
    """Trials of a stored study that evaluated a config; 0 for a study the database lacks."""
    import optuna

    try:
        study = optuna.load_study(study_name=name, storage=optuna_storage(url))
    except KeyError:  # a best config imported from another database has no study here
        return 0
    return counted(study.get_trials(deepcopy=False))


def _of_current_build(attrs: Mapping[str, Any], build_key: Callable[[Config], str]) -> bool:
    """Whether a trial measured the build made of its config today."""
    raw, key = attrs.get("config"), attrs.get("build_key")
    if not raw or not key:
        return False
    try:
        return bool(build_key(Config.from_json(raw)) == key)
    except (InvalidConfig, ValueError):
        return False
