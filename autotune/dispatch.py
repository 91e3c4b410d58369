"""Decide which kernel runs a problem on a GPU, once per problem key, then remember it.

Order: the exact problem tuned in the database; else the nearest tuned problem of the same
dtype, head dim and causality (store.repo.problem_distance); else a built-in default for the
head dim; else torch SDPA (fallback), with the reason. Tuned configs come from the database
whatever their kernel family (the tuner stored the fastest of all families); each is checked
against its own family's space and this GPU, and one this GPU cannot run is skipped with the
reason. The built-in default is that of the family of highest `dispatch_priority` (a key of
each space file) among those the GPU runs. A chosen config that is not compiled yet is compiled
now (unless compile-on-miss is off, then the next option is tried). The first use of a
database on a GPU in a process imports the shipped results of that GPU from db/: they fill the
problems not tuned in that database and refresh rows imported from older shipped files, and
never replace a config tuned there.

After the first call per key the decision is a dict lookup: no database query, no file I/O, no
compile; each cubin is loaded once per process.
"""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from typing import Any

from ._jsonfile import JsonInputError, read_json
from ._paths import db_dir
from .compiler import compile_config, lookup
from .config import Config
from .kernel import CompiledKernel
from .problem import Problem
from .space import default_config, load_space, supported_families, unsupported_reason
from .store.records import DeviceInfo
from .store.repo import BrokenRow, TuningStore
from .target import Target, target_for_device

EXACT, NEAREST, HEURISTIC, FALLBACK = "exact", "nearest", "heuristic", "fallback"


@dataclass(frozen=True)
class Decision:
    path: str  # exact | nearest | heuristic | fallback
    reason: str
    config: Config | None = None
    tuned_problem: Problem | None = None  # the database problem the config was tuned on
    distance: float = 0.0
    measured_us: float | None = None  # on tuned_problem
    measured_tflops: float | None = None
    speedup_vs_sdpa: float | None = None
    kernel: CompiledKernel | None = field(default=None, compare=False, repr=False)
    skipped: tuple[str, ...] = ()  # better-ranked options passed over, each with its reason

    def describe(self) -> str:
        if self.config is None:
            return f"fallback to torch SDPA: {self.reason}"
        name = load_space(self.config.family).name_of(self.config)
        tuned = self.tuned_problem.describe() if self.tuned_problem else ""
        where = {EXACT: "tuned for this problem", HEURISTIC: "built-in default for this head dim",
                 NEAREST: f"tuned for {tuned} (distance {self.distance:.2f})"}[self.path]
        speed = (f"; measured {self.measured_tflops:.0f} TFLOP/s, {self.speedup_vs_sdpa:.2f}x SDPA"
                 if self.measured_tflops and self.speedup_vs_sdpa else "")
        passed = f" (passed over: {'; '.join(self.skipped)})" if self.skipped else ""
        return f"{self.path}: {name}, {where}{speed}{passed}"


def device_info(index: int) -> DeviceInfo:
    """Identity of a GPU for lookups: model, compute capability and SM count."""
    import torch

    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(props.name, props.major * 10 + props.minor, props.multi_processor_count,
                      "", str(torch.version.cuda))


def shipped_results() -> list[dict[str, Any]]:
    """The pre-tuned result files shipped in db/ (JSON exports)."""
    found = []
    for path in sorted(db_dir().glob("*.json")):
        try:
            found.append(read_json(path))
        except JsonInputError:
            continue
    return found


class Dispatcher:
    def __init__(self, db: str | None = None, *, compile_on_miss: bool = True,
                 use_shipped: bool = True) -> None:
        self.db = db
        self.compile_on_miss = compile_on_miss
        self.use_shipped = use_shipped
        self._memo: dict[tuple[Any, ...], Decision] = {}
        self._lock = threading.Lock()
        self._store: TuningStore | None = None
        self._seeded: set[str] = set()
        self._warned_db = False
        self.db_queries = 0  # for tests: a repeated call must not touch the database

    def store(self) -> TuningStore:
        if self._store is None:
            self._store = TuningStore(self.db)
        return self._store

    def _seed_from_shipped(self, device: DeviceInfo) -> None:
        """Import the shipped results of this GPU model (once per process): they fill the
        problems the database has no best config for and refresh rows imported from older
        shipped files; a config tuned in this database is never replaced."""
        if not self.use_shipped or device.name in self._seeded:
            return
        self._seeded.add(device.name)
        store = self.store()
        for document in shipped_results():
            entries = [e for e in document.get("results", [])
                       if e.get("device", {}).get("name") == device.name
                       and e.get("device", {}).get("sm_count") == device.sm_count]
            if entries:
                try:
                    store.import_results({**document, "results": entries},
                                         refresh_imported=True)
                except BrokenRow:
                    continue  # a damaged shipped file must not stop attention from running

    def decide(self, problem: Problem, device_index: int) -> Decision:
        key = (device_index, problem)
        decision = self._memo.get(key)
        if decision is None:
            with self._lock:
                decision = self._memo.get(key)
                if decision is None:
                    decision = self._decide(problem, device_index)
                    self._memo[key] = decision
        return decision

    def _candidates(self, problem: Problem, device: DeviceInfo,
                    target: Target) -> tuple[list[Decision], list[str]]:
        """The options in order of preference, and why better ones are missing (a database
        that cannot be used, a row refused): reasons the decision keeps."""
        options: list[Decision] = []
        notes: list[str] = []
        try:
            self.db_queries += 1
            self._seed_from_shipped(device)
            store = self.store()
            exact = store.best(device, problem)
            if exact is not None:
                options.append(Decision(EXACT, "tuned for this problem", exact.config,
                                        exact.problem, 0.0, exact.median_us, exact.tflops,
                                        exact.speedup_vs_default))
            near = store.nearest(device, problem)
            if near is not None and (exact is None or near[0].config != exact.config):
                record, distance = near
                options.append(Decision(NEAREST, "nearest tuned problem", record.config,
                                        record.problem, distance, record.median_us,
                                        record.tflops, record.speedup_vs_default))
        except BrokenRow as exc:
            notes.append(f"refused a database row: {exc}")
        except Exception as exc:  # noqa: BLE001 - an unusable database must not stop attention
            notes.append(f"tuning database unavailable: {exc}")
            if not self._warned_db:
                self._warned_db = True
                warnings.warn(f"cute-autotune: tuning database unavailable, dispatch uses the "
                              f"built-in defaults: {exc}", stacklevel=2)
        heuristic = default_config(problem.space_values(), target)
        if heuristic is not None:
            options.append(Decision(HEURISTIC, "no tuned problem of this dtype, head dim and "
                                    "causality on this GPU", heuristic))
        return options, notes

    def _identify(self, device_index: int) -> tuple[DeviceInfo, Target]:
        return device_info(device_index), target_for_device(device_index)

    def _decide(self, problem: Problem, device_index: int) -> Decision:
        device, target = self._identify(device_index)
        if not supported_families(target):
            return Decision(FALLBACK, f"{device.name}: {unsupported_reason(target)}")
        options, problems = self._candidates(problem, device, target)
        for option in options:
            assert option.config is not None
            reasons = load_space(option.config.family).violations(option.config, target)
            if reasons:
                problems.append(f"{option.path} {option.config.family} config cannot run here: "
                                f"{'; '.join(reasons)}")
                continue
            kernel = self._load(option.config, target, device_index, problems)
            if kernel is not None:
                return Decision(option.path, option.reason, option.config, option.tuned_problem,
                                option.distance, option.measured_us, option.measured_tflops,
                                option.speedup_vs_sdpa, kernel, tuple(problems))
        return Decision(FALLBACK, "; ".join(problems) or "no kernel for this problem")

    def _load(self, config: Config, target: Target, device_index: int,
              problems: list[str]) -> CompiledKernel | None:
        build = lookup(config, target)
        if build is None:
            if not self.compile_on_miss:
                problems.append(f"{load_space(config.family).name_of(config)} is not compiled "
                                "and compile-on-miss is off")
                return None
            build = compile_config(config, target)
        if not build.ok:
            problems.append(f"{build.status}: {build.message[:300]}")
            return None
        try:
            return CompiledKernel(build, device_index)
        except Exception as exc:  # noqa: BLE001 - a cubin that does not load is a reason
            problems.append(f"cannot load {build.cubin}: {exc}")
            return None

    def clear(self) -> None:
        with self._lock:
            self._memo.clear()
