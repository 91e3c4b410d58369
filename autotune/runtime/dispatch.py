"""Decide which kernel runs a problem on a GPU, once per problem key, then remember it.

Order: the exact problem tuned in the database; else the nearest tuned problem of the same
head dim and causality whose decision carries over (store.repo.problem_distance; `_nearest`
says what carries over: a kernel config, torch SDPA's win only from a problem torch runs the
same way, and the other dtype's configs a step farther); else a built-in default for the head
dim; else torch SDPA (fallback), with the reason. A tuned winner may be torch SDPA itself
(a config of the `sdpa` pseudo-family: one backend), and dispatch then calls that backend. The
kernels are never slower than what the user had where it was measured, and are not guessed at
where it was not: a kernel family timed in the problem's region (head dim, dtype, causality,
Lq bucket) on this GPU and never faster than SDPA there is not carried there by the nearest
lookup, nor one carried from another Lq bucket without a win in this one; the built-in default
runs only where its family was measured faster than SDPA in the region (or, never timed there,
in the other dtype's); SDPA's default runs instead (`untuned="kernel"` restores
the kernels' built-in defaults everywhere, for testing them). Tuned configs come from the database
whatever their kernel family (the tuner stored the fastest of all families); each is checked
against its own family's space and this GPU, and one this GPU cannot run is skipped with the
reason. The built-in default is that of the family of highest `dispatch_priority` (a key of
each space file) among those the GPU runs. A chosen config's cubin comes from the cubin cache,
else from the installed kernel pack (build/pack.py: prebuilt, so that a GPU machine without the
CUDA toolkit runs the shipped configs), else from nvcc now (unless compile-on-miss is off or
there is no nvcc: then the next option is tried, and the reason kept). The first use of a
database on a GPU in a process imports the shipped results of that GPU from db/: they fill the
problems not tuned in that database and refresh rows imported from older shipped files, and
never replace a config tuned there.

Decisions are made per length class (model/buckets.py), not per length: a problem tuned in the
database as it is is decided as itself, any other for the representative of its class, so a KV
cache that grows by a token per step, or requests of every length, make a new decision only
when they reach a new class. After the first call per class the decision is a lookup in a
bounded memo (the most recently used `MEMO_SIZE`): no database query, no file I/O, no compile;
each cubin is loaded once per process.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, TypeVar

from .._bounded import LruDict
from .._jsonfile import JsonInputError, read_json
from .._paths import shipped_results_files
from ..build.obtain import obtain
from ..build.toolchain import family_source_hash
from ..launch.kernel import CompiledKernel
from ..measure.sdpa import sdpa_path
from ..model.buckets import representative
from ..model.config import Config, InvalidConfig
from ..model.problem import Problem
from ..model.space import (
    SDPA_FAMILY,
    default_config,
    load_space,
    supported_families,
    unsupported_reason,
)
from ..model.target import Target, target_for_device
from ..store.perf_models import model_for
from ..store.records import DeviceInfo
from ..store.repo import BrokenRow, TuningStore

EXACT, NEAREST, HEURISTIC, FALLBACK = "exact", "nearest", "heuristic", "fallback"
UNTUNED_ENV = "CUTE_AUTOTUNE_UNTUNED"
MEMO_SIZE = 4096  # decisions remembered per dispatcher (least recently used dropped)
# how much farther a tuned problem of the other dtype (fp16 against bf16) counts than one of
# the problem's own: as far as one with a length twice as long
TWIN_DTYPE_DISTANCE = 1.0
# A kernel config carried to an untuned problem that torch runs the same way as the tuned one
# needs this much measured advantage over SDPA's default there: a tie does not survive the
# move (a 1.02x sm90 win carried to B3 H12 L1531 D64 fp16 causal ran at 0.97x on the H200), and
# SDPA's default costs what SDPA costs, the floor the runtime promises.
CARRY_MARGIN = 1.05

T = TypeVar("T")


def lq_bucket(seqlen_q: int) -> str:
    """The query-length class a region is made of: decode (1, up to 16), short, prefill."""
    return (
        "1"
        if seqlen_q <= 1
        else "2-16"
        if seqlen_q <= 16
        else ("17-128" if seqlen_q <= 128 else ">128")
    )


def region(problem: Problem) -> tuple[int, str, bool, str]:
    return (problem.head_dim, problem.dtype, problem.causal, lq_bucket(problem.seqlen_q))


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
    decided: str | None = None  # how the tuner chose this winner (its margin or tie rule)
    # the problem this was decided for: the one asked, where it is tuned, else its length
    # class's representative (None: not through `decide`)
    decided_for: Problem | None = None
    # explain()'s: what the GPU's performance model predicts of the config and of SDPA
    predicted: str | None = None

    @property
    def sdpa_backend(self) -> str | None:
        """The torch SDPA backend this decision runs, when the winner is torch's own."""
        if self.config is not None and self.config.family == SDPA_FAMILY:
            return str(self.config["backend"])
        return None

    def describe(self) -> str:
        if self.config is None:
            return f"fallback to torch SDPA: {self.reason}"
        name = load_space(self.config.family).name_of(self.config)
        tuned = self.tuned_problem.describe() if self.tuned_problem else ""
        where = {
            EXACT: "tuned for this problem",
            HEURISTIC: (
                self.reason if self.sdpa_backend else "built-in default for this head dim"
            ),
            NEAREST: f"tuned for {tuned} (distance {self.distance:.2f})",
        }[self.path]
        if self.sdpa_backend is not None:
            name = f"torch SDPA ({self.sdpa_backend} backend)"
        speed = (
            f"; measured {self.measured_tflops:.0f} TFLOP/s, {self.speedup_vs_sdpa:.2f}x SDPA"
            f" default"
            if self.measured_tflops and self.speedup_vs_sdpa
            else ""
        )
        if self.decided:
            speed += f"; {self.decided}"
        passed = f" (passed over: {'; '.join(self.skipped)})" if self.skipped else ""
        predicted = f"; {self.predicted}" if self.predicted else ""
        return f"{self.path}: {name}, {where}{speed}{passed}{predicted}"


def with_prediction(
    decision: Decision, problem: Problem, device: DeviceInfo, store: TuningStore | None = None
) -> Decision:
    """`decision` with what the performance model of `device` (fitted in `store`, or shipped
    in db/: store.perf_models.model_for) predicts of its config and of torch SDPA's default on
    `problem` (unchanged where there is no model for the GPU or the model never learnt the
    config's family). Read by `explain()`, never on a call's path: dispatch decides by
    measurements, the model's error across problems being wider than the margins it decides
    on."""
    config = decision.config
    if config is None:
        return decision
    model, source = model_for(store, device.name)
    if model is None or config.family not in model.families:
        return decision
    sdpa = load_space(SDPA_FAMILY).config(**problem.space_values(), backend="default")
    ours, theirs = model.predict(problem, config), model.predict(problem, sdpa)
    text = f"the {device.name} model ({source}) predicts {ours.describe()}"
    if config.family != SDPA_FAMILY or config["backend"] != "default":
        text += f" against {theirs.describe()} for SDPA's default"
    stale = model.stale_families({config.family: family_source_hash(load_space(config.family))})
    if stale:
        text += " (fitted on an older version of this family's kernels)"
    return replace(decision, predicted=text)


class TunedChoice(NamedTuple):
    """A config the database knows for a problem, why, and how far the problem it was tuned
    for lies (`store.repo.problem_distance`: 0 for the problem itself)."""

    config: Config
    reason: str
    distance: float = 0.0


def split_grid(config: Config, problem: Problem) -> int:
    """The CTAs of a split-KV config's grid on `problem` before its KV splits: one per block of
    `block_m` rows of each KV head's packed query rows (Lq x group, where the config packs
    GQA heads), or of each query head's rows, per sequence."""
    packs = bool(dict(config.values).get("pack_gqa", True))
    rows = problem.seqlen_q * (problem.group_size if packs else 1)
    heads = problem.heads_kv if packs else problem.heads_q
    return problem.batch * heads * -(-rows // int(config["block_m"]))


def carried_splits(config: Config, source: Problem, target: Problem) -> Config:
    """`config`, tuned on `source`, for `target`: its KV split count (a launch parameter, one
    build for every value) scaled so the grid holds as many CTAs on `target` as it did on the
    problem it was tuned for (the tuner chose a number of waves, not a number of splits: 8
    splits that fill the GPU at batch 8 fill an eighth of it at batch 1), at most one split
    per key tile, and one of the family's allowed values (the nearest, in log scale).
    Configs without a split count come back as they are."""
    if "num_splits" not in dict(config.values):
        return config
    from ..model.space import load_space

    allowed = sorted(int(v) for v in load_space(config.family).params["num_splits"].values)
    wanted = int(config["num_splits"]) * split_grid(config, source) / split_grid(config, target)
    tiles = -(-target.seqlen_k // int(config["block_n"]))
    wanted = max(1.0, min(wanted, float(tiles)))
    splits = min(allowed, key=lambda v: (abs(math.log2(v / wanted)), v))
    if splits == config["num_splits"]:
        return config
    return load_space(config.family).validate(config.replace(num_splits=splits))


def _twin_dtype(dtype: str) -> str:
    return "bf16" if dtype == "fp16" else "fp16"


def _sdpa_path(problem: Problem) -> tuple[str, bool, bool, str]:
    return sdpa_path(
        problem.seqlen_q,
        problem.seqlen_k,
        problem.heads_q,
        problem.heads_kv,
        causal=problem.causal,
        kv_cache=problem.kv_cache,
    )


def _region_text(problem: Problem) -> str:
    head_dim, dtype, causal, bucket = region(problem)
    return f"D={head_dim} {dtype} {'causal' if causal else 'non-causal'} Lq in {bucket}"


def _within_carry_margin(option: Decision, problem: Problem) -> bool:
    """Whether `option`, a kernel config carried from a tuned problem that torch runs as it
    runs `problem`, won there by less than CARRY_MARGIN (where torch takes another path, what
    SDPA measured there says nothing of it here)."""
    return (
        option.path == NEAREST
        and option.config is not None
        and option.config.family != SDPA_FAMILY
        and option.tuned_problem is not None
        and option.speedup_vs_sdpa is not None
        and option.speedup_vs_sdpa < CARRY_MARGIN
        and _sdpa_path(option.tuned_problem) == _sdpa_path(problem)
    )


def _for_class(decision: Decision, decided_for: Problem, tuned: bool) -> Decision:
    """A decision made for `decided_for` as it serves the problems of its length class: where
    the class's representative is tuned and the problem asked is not, each is served by its
    nearest tuned problem."""
    decision = replace(decision, decided_for=decided_for)
    if decision.path == EXACT and not tuned:
        decision = replace(
            decision, path=NEAREST, reason="the tuned representative of this length class"
        )
    return decision


def device_info(index: int) -> DeviceInfo:
    """Identity of a GPU for lookups: model, compute capability and SM count."""
    import torch

    props = torch.cuda.get_device_properties(index)
    return DeviceInfo(
        props.name,
        props.major * 10 + props.minor,
        props.multi_processor_count,
        "",
        str(torch.version.cuda),
    )


def shipped_results() -> list[dict[str, Any]]:
    """The pre-tuned result files shipped in db/ (JSON exports)."""
    found = []
    for path in shipped_results_files():
        try:
            found.append(read_json(path))
        except JsonInputError:
            continue
    return found


def _shipped_sibling(device: DeviceInfo) -> DeviceInfo | None:
    """A GPU model of the shipped results with `device`'s compute capability and SM count
    (another name), or None."""
    for document in shipped_results():
        for entry in document.get("results", []):
            other = entry.get("device", {})
            if (
                other.get("compute_capability") == device.compute_capability
                and other.get("sm_count") == device.sm_count
                and other.get("name") != device.name
            ):
                try:
                    return DeviceInfo(
                        str(other["name"]),
                        device.compute_capability,
                        device.sm_count,
                        str(other.get("driver_version", "")),
                        str(other.get("cuda_version", "")),
                    )
                except KeyError:
                    continue
    return None


class Dispatcher:
    def __init__(
        self,
        db: str | None = None,
        *,
        compile_on_miss: bool = True,
        use_shipped: bool = True,
        untuned: str = "measured",
    ) -> None:
        if untuned not in ("measured", "kernel"):
            raise ValueError(f"untuned must be 'measured' or 'kernel', got {untuned!r}")
        self.db = db
        self.compile_on_miss = compile_on_miss
        self.use_shipped = use_shipped
        self.untuned = untuned
        self._memo: LruDict[tuple[Any, ...], Decision] = LruDict(MEMO_SIZE)
        self._family_memo: LruDict[tuple[Any, ...], TunedChoice | None] = LruDict(MEMO_SIZE)
        self._tuned_problems: dict[DeviceInfo, frozenset[Problem]] = {}
        self._lock = threading.Lock()
        self._store: TuningStore | None = None
        self._seeded: set[str] = set()
        self._results_of: dict[str, DeviceInfo] = {}  # GPU name -> whose results it reads
        # device index -> (its GPU model, its target): a process's GPUs do not change, and a
        # cache growing by a token per step asks for them at every new length
        self._identities: dict[int, tuple[DeviceInfo, Target]] = {}
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
            entries = [
                e
                for e in document.get("results", [])
                if e.get("device", {}).get("name") == device.name
                and e.get("device", {}).get("sm_count") == device.sm_count
            ]
            if entries:
                try:
                    store.import_results({**document, "results": entries}, refresh_imported=True)
                except BrokenRow:
                    continue  # a damaged shipped file must not stop attention from running

    def decision_problem(self, problem: Problem, device_index: int) -> tuple[Problem, bool]:
        """The problem a decision for `problem` is made for and remembered by, and whether it
        is `problem` itself tuned in the database (else the representative of its length
        class)."""
        device, _ = self._identify(device_index)
        return self._decision_problem(problem, device)

    def _decision_problem(self, problem: Problem, device: DeviceInfo) -> tuple[Problem, bool]:
        known = self._tuned_problems.get(device)
        if known is None:
            with self._lock:
                known = self._tuned_problems.get(device)
                if known is None:
                    known = self._tuned_problems[device] = self._read_tuned_problems(device)
        return (problem, True) if problem in known else (representative(problem), False)

    def _read_tuned_problems(self, device: DeviceInfo) -> frozenset[Problem]:
        """The problems tuned for this GPU model (read once: the shipped results first)."""
        try:
            self.db_queries += 1
            self._seed_from_shipped(device)
            return self.store().tuned_problems(device)
        except Exception:  # noqa: BLE001 - _candidates says why the database is unusable
            return frozenset()

    def decide(self, problem: Problem, device_index: int) -> Decision:
        """What runs `problem`: decided once per length class (the same for every problem of
        the class), except for a problem tuned as it is."""
        decided_for, tuned = self.decision_problem(problem, device_index)
        key = (device_index, decided_for, tuned)
        decision = self._memo.get(key)
        if decision is None:
            with self._lock:
                decision = self._memo.get(key)
                if decision is None:
                    decision = _for_class(
                        self._decide(decided_for, device_index), decided_for, tuned
                    )
                    self._memo[key] = decision
        return decision

    def tuned_config(
        self, problem: Problem, device_index: int, family: str | tuple[str, ...]
    ) -> TunedChoice | None:
        """The config of `family` (or of any of several) the database knows best for `problem`
        on this GPU model, and why: the fastest measured one of the problem itself, else the
        best config of the nearest tuned problem whose best is of `family`; None when it knows
        neither (or cannot be read). For callers that can run only some families (KV caches:
        the split-KV families that read the cache's kind).
        Remembered per (device, length class, families): a repeated call, or a call of
        another length of the class, touches no database."""
        families = (family,) if isinstance(family, str) else tuple(family)
        decided_for, _ = self.decision_problem(problem, device_index)
        key = (device_index, decided_for, families)
        if key in self._family_memo:
            return self._family_memo.get(key)
        with self._lock:
            if key not in self._family_memo:
                chosen = self._tuned_config(decided_for, device_index, families)
                self._family_memo[key] = chosen
                return chosen
        return self._family_memo.get(key)

    def tuned_backward(self, problem: Problem, device_index: int) -> TunedChoice | None:
        """What the database knows best for a backward problem (`Problem.backward`) on this GPU
        model, and why: the winner of its own re-ranking (a backward config, or torch's
        backward as an `sdpa` config), else that of the nearest tuned backward problem of its
        dtype, head dim, mask and mode; None when it knows neither (or cannot be read).
        Remembered per length class, as `tuned_config`."""
        decided_for, _ = self.decision_problem(problem, device_index)
        key = (device_index, decided_for, "backward")
        if key in self._family_memo:
            return self._family_memo.get(key)
        with self._lock:
            if key not in self._family_memo:
                chosen = self._tuned_backward(decided_for, device_index)
                self._family_memo[key] = chosen
                return chosen
        return self._family_memo.get(key)

    def _tuned_backward(self, problem: Problem, device_index: int) -> TunedChoice | None:
        device, _ = self._identify(device_index)
        try:
            self.db_queries += 1
            self._seed_from_shipped(device)
            store = self.store()
            best = store.best(device, problem)
            if best is not None:
                return TunedChoice(best.config, "tuned for this problem (its re-ranking's winner)")
            near = store.nearest(device, problem)
            if near is not None:
                record, distance = near
                why = f"nearest tuned problem ({record.problem.describe()})"
                return TunedChoice(record.config, why, distance)
        except Exception as exc:  # noqa: BLE001 - an unusable database must not stop training
            if not self._warned_db:
                self._warned_db = True
                warnings.warn(
                    f"cute-autotune: tuning database unavailable, torch's backward is used: {exc}",
                    stacklevel=3,
                )
        return None

    def _tuned_config(
        self, problem: Problem, device_index: int, families: tuple[str, ...]
    ) -> TunedChoice | None:
        device, _ = self._identify(device_index)
        try:
            self.db_queries += 1
            self._seed_from_shipped(device)
            store = self.store()
            timed = [
                t
                for t in store.timings(device, problem)
                if t.config.family in families and t.median_us is not None
            ]
            if timed:
                fastest = min(timed, key=lambda t: float(t.median_us or 0.0))
                return TunedChoice(
                    fastest.config,
                    f"tuned for this problem: the fastest of {len(timed)} "
                    f"measured {' or '.join(families)} configs",
                )
            near = store.nearest(device, problem, family=families)
            if near is not None:
                config, source = near[0].config, near[0].problem
                carried = carried_splits(config, source, problem)
                why = f"nearest tuned problem ({source.describe()})"
                if carried != config:
                    why += (
                        f", its {config['num_splits']} KV splits made "
                        f"{carried['num_splits']} for this grid"
                    )
                return TunedChoice(carried, why, near[1])
        except Exception as exc:  # noqa: BLE001 - an unusable database must not stop attention
            if not self._warned_db:
                self._warned_db = True
                warnings.warn(
                    f"cute-autotune: tuning database unavailable, the default of "
                    f"{families[0]} is used: {exc}",
                    stacklevel=3,
                )
        return None

    def _candidates(
        self, problem: Problem, device: DeviceInfo, target: Target
    ) -> tuple[list[Decision], list[str]]:
        """The options in order of preference, and why better ones are missing (a database
        that cannot be used, a row refused, a family not measured faster than SDPA here, a
        decision that does not carry over): reasons the decision keeps."""
        options: list[Decision] = []
        notes: list[str] = []
        faster: set[str] = set()  # kernel families measured faster than SDPA here
        measured: set[str] = set()  # kernel families measured beside SDPA here
        twin_faster: set[str] = set()  # the same, of the problem in the other dtype

        def unless_refused(read: Callable[[], T]) -> T | None:
            # a refused row costs its own option, never the lookups after it
            try:
                return read()
            except BrokenRow as exc:
                notes.append(f"refused a database row: {exc}")
                return None

        try:
            self.db_queries += 1
            self._seed_from_shipped(device)
            store = self.store()
            exact = unless_refused(lambda: store.best(device, problem))
            if exact is not None:
                options.append(self._tuned(EXACT, "tuned for this problem", exact, 0.0))
            # with the problem tuned, the nearest is only a second choice (its config may
            # not build here): of this dtype
            near = self._nearest(store, device, problem, notes, unless_refused, twin=exact is None)
            if near is not None and (exact is None or near.config != exact.config):
                options.append(near)
            if self.untuned == "measured":
                faster, measured = unless_refused(
                    lambda: store.families_against_sdpa(device, region(problem), lq_bucket)
                ) or (set(), set())
                twin = replace(problem, dtype=_twin_dtype(problem.dtype))
                twin_faster = (
                    unless_refused(
                        lambda: store.families_faster_than_sdpa(device, region(twin), lq_bucket)
                    )
                    or set()
                )
        except Exception as exc:  # noqa: BLE001 - an unusable database must not stop attention
            notes.append(f"tuning database unavailable: {exc}")
            if not self._warned_db:
                self._warned_db = True
                warnings.warn(
                    f"cute-autotune: tuning database unavailable, dispatch uses the "
                    f"built-in defaults: {exc}",
                    stacklevel=2,
                )
        if self.untuned == "measured":
            kept = []
            for option in options:
                assert option.config is not None
                family = option.config.family
                # a kernel config carried over from a problem of the same query-length class
                # is blocked only by evidence against it (its family timed in this region and
                # never faster than SDPA there); one carried across classes (prefill to
                # decode) needs evidence for it (its family timed faster here)
                if (
                    option.path == NEAREST
                    and family != SDPA_FAMILY
                    and family not in faster
                    and (
                        family in measured
                        or option.tuned_problem is None
                        or lq_bucket(option.tuned_problem.seqlen_q) != lq_bucket(problem.seqlen_q)
                    )
                ):
                    notes.append(
                        f"nearest {family} config not taken: {family} was never "
                        f"measured faster than torch SDPA for {_region_text(problem)}"
                    )
                    continue
                if _within_carry_margin(option, problem):
                    assert option.tuned_problem is not None
                    notes.append(
                        f"nearest {family} config not taken: "
                        f"{option.speedup_vs_sdpa:.2f}x SDPA's default on "
                        f"{option.tuned_problem.describe()}, within the "
                        f"{CARRY_MARGIN:.2f}x a carried config needs"
                    )
                    kept.append(
                        Decision(
                            HEURISTIC,
                            "its nearest tuned problem's kernel won by too little to carry over",
                            load_space(SDPA_FAMILY).heuristic(problem.space_values()),
                        )
                    )
                    continue
                kept.append(option)
            options = kept
        heuristic = default_config(problem.space_values(), target)
        # the built-in default is a guess: taken where its family was timed faster than SDPA
        # in this region, or, never timed here, in the same region of the other dtype
        if heuristic is not None and (
            self.untuned == "kernel"
            or heuristic.family in faster
            or (heuristic.family not in measured and heuristic.family in twin_faster)
        ):
            options.append(
                Decision(
                    HEURISTIC,
                    "no tuned problem of this dtype, head dim and causality on this GPU",
                    heuristic,
                )
            )
        elif heuristic is not None:
            options.append(
                Decision(
                    HEURISTIC,
                    f"untuned, and no kernel family was measured faster than torch "
                    f"SDPA for {_region_text(problem)} on this GPU",
                    load_space(SDPA_FAMILY).heuristic(problem.space_values()),
                )
            )
        return options, notes

    def _nearest(
        self,
        store: TuningStore,
        device: DeviceInfo,
        problem: Problem,
        notes: list[str],
        unless_refused: Callable[[Callable[[], Any]], Any],
        *,
        twin: bool = True,
    ) -> Decision | None:
        """The nearest tuned problem whose decision carries over to `problem`: a kernel
        config (our kernels compute every mask and shape alike), or a torch SDPA backend won on
        a problem torch runs the same way (`sdpa_path`: its mask, GQA, decode-sized or not);
        of this dtype or, with `twin`, of the other one counted `TWIN_DTYPE_DISTANCE` farther
        (fp16 and bf16 share configs: the same kernel up to the dtype)."""
        path = _sdpa_path(problem)
        passed: list[Any] = []  # the nearer SDPA wins that do not carry over

        def carries_over(record: Any) -> bool:
            if record.config.family != SDPA_FAMILY or _sdpa_path(record.problem) == path:
                return True
            passed.append(record)
            return False

        def lookup(asked: Problem) -> Callable[[], Any]:
            return lambda: store.nearest(device, asked, accept=carries_over)

        found = []
        asked = [problem, replace(problem, dtype=_twin_dtype(problem.dtype))][: 1 + twin]
        for rank, one in enumerate(asked):
            hit = unless_refused(lookup(one))
            if hit is not None:
                found.append((hit[1] + rank * TWIN_DTYPE_DISTANCE, rank, hit[0]))
        if not found:
            notes.extend(self._not_carried(r, problem) for r in passed[:1])
            return None
        distance, rank, record = min(found, key=lambda f: (f[0], f[1]))
        notes.extend(
            self._not_carried(r, problem) for r in passed[:1] if r.problem.dtype == problem.dtype
        )
        if rank == 0:
            decision = self._tuned(NEAREST, "nearest tuned problem", record, distance)
            carried = carried_splits(record.config, record.problem, problem)
            return decision if carried == record.config else replace(decision, config=carried)
        config = carried_splits(record.config, record.problem, problem)
        try:
            config = load_space(config.family).validate(
                Config.make(config.family, {**dict(config.values), "dtype": problem.dtype})
            )
        except InvalidConfig as exc:
            notes.append(
                f"the {record.problem.dtype} twin's config does not hold in {problem.dtype}: {exc}"
            )
            return None
        return replace(
            self._tuned(
                NEAREST,
                f"nearest tuned problem, in {record.problem.dtype} (fp16 and bf16 share configs)",
                record,
                distance,
            ),
            config=config,
        )

    @staticmethod
    def _not_carried(record: Any, problem: Problem) -> str:
        return (
            f"nearest tuned problem {record.problem.describe()} was won by torch SDPA, "
            f"which runs {problem.describe()} another way "
            f"({', '.join(map(str, _sdpa_path(record.problem)))} against "
            f"{', '.join(map(str, _sdpa_path(problem)))}): not carried over"
        )

    @staticmethod
    def _tuned(path: str, reason: str, record: Any, distance: float) -> Decision:
        return Decision(
            path,
            reason,
            record.config,
            record.problem,
            distance,
            record.median_us,
            record.tflops,
            record.speedup_vs_default,
            decided=record.decision,
        )

    def _identify(self, device_index: int) -> tuple[DeviceInfo, Target]:
        """The GPU model whose results the lookups read (`results_device`) and the target of
        the GPU itself (what a config must fit)."""
        identity = self._identities.get(device_index)
        if identity is None:
            identity = (device_info(device_index), target_for_device(device_index))
            self._identities[device_index] = identity
        return self.results_device(identity[0]), identity[1]

    def results_device(self, device: DeviceInfo) -> DeviceInfo:
        """The GPU model whose tuning results dispatch reads for `device`: its own; where
        neither the database nor the shipped results hold any for it (and shipped results
        are used), the shipped GPU model of the same compute capability and SM count, whose
        SMs, clocks and shared memory are the same, so that its configs and rankings carry
        over (an H100 SXM reads the H200's); decisions then name it. Found once per GPU
        model."""
        found = self._results_of.get(device.name)
        if found is None:
            found = device
            if self.use_shipped and not self._read_tuned_problems(device):
                found = _shipped_sibling(device) or device
            self._results_of[device.name] = found
        return found

    def _decide(self, problem: Problem, device_index: int) -> Decision:
        device, target = self._identify(device_index)
        if not supported_families(target):
            return Decision(FALLBACK, f"{device.name}: {unsupported_reason(target)}")
        options, problems = self._candidates(problem, device, target)
        decision = self._first(
            options, problems, target, lambda c: self._load(c, target, device_index, problems)
        )
        read = self._results_of.get(target.name)  # target.name: the GPU's own name
        if read is not None and read.name != target.name:
            decision = replace(
                decision,
                reason=f"{decision.reason} (from the results of the "
                f"{read.model}: same compute capability and SM count)",
            )
        return decision

    @staticmethod
    def _first(
        options: list[Decision],
        problems: list[str],
        target: Target,
        load: Callable[[Config], CompiledKernel | None] | None,
        *,
        kernels_only: bool = False,
    ) -> Decision:
        """The first option that can run on `target`: torch SDPA's (nothing to load; passed
        over with `kernels_only`), or a kernel config the target allows and `load` loads (every
        allowed one when `load` is None); what was passed over, and why, goes in `skipped`."""
        for option in options:
            assert option.config is not None
            if option.config.family == SDPA_FAMILY:
                if kernels_only:
                    continue
                return replace(option, skipped=tuple(problems))
            reasons = load_space(option.config.family).violations(option.config, target)
            if reasons:
                problems.append(
                    f"{option.path} {option.config.family} config cannot run here: "
                    f"{'; '.join(reasons)}"
                )
                continue
            if load is None:
                return replace(option, skipped=tuple(problems))
            kernel = load(option.config)
            if kernel is not None:
                return replace(option, kernel=kernel, skipped=tuple(problems))
        return Decision(FALLBACK, "; ".join(problems) or "no kernel for this problem")

    def _load(
        self, config: Config, target: Target, device_index: int, problems: list[str]
    ) -> CompiledKernel | None:
        """The loaded kernel of a config `_first` found fitting `target` (a ValidConfig: from
        the store or a space's heuristic, so nothing here validates it again)."""
        valid = load_space(config.family).validate(config)  # as it is: no check runs again
        # the cache first, then the installed kernel pack (no nvcc needed); only a config
        # found in neither runs nvcc, where there is one and compile-on-miss is on
        build = obtain(valid, target, compile_on_miss=self.compile_on_miss)
        if not build.ok:
            problems.append(f"{build.status}: {build.message[:500]}")
            return None
        try:
            return CompiledKernel(build, device_index)
        except Exception as exc:  # noqa: BLE001 - a cubin that does not load is a reason
            problems.append(f"cannot load {build.cubin}: {exc}")
            return None

    def kernel_decision(self, problem: Problem, device_index: int) -> Decision:
        """The best decision that runs one of our kernels (never torch SDPA): for a call that
        needs what only a kernel gives where SDPA won (its log-sum-exp, when no torch op
        returns it for the problem)."""
        device, target = self._identify(device_index)
        options, problems = self._candidates(problem, device, target)
        heuristic = default_config(problem.space_values(), target)
        if heuristic is not None:
            options.append(
                Decision(HEURISTIC, "built-in default (SDPA cannot serve this call)", heuristic)
            )
        return self._first(
            options,
            problems,
            target,
            lambda c: self._load(c, target, device_index, problems),
            kernels_only=True,
        )

    def clear(self) -> None:
        with self._lock:
            self._memo.clear()
            self._family_memo.clear()
            self._tuned_problems.clear()

    def would_run(self, problem: Problem, device: DeviceInfo, target: Target) -> Decision:
        """What `decide` would choose for `problem` on `device` (of `target`), without a GPU
        (for its length class, as `decide`): the first option whose config the target
        allows. Nothing is compiled or loaded, so a config that would fail to build or load
        here is not seen (`decide` would pass over it); the answer is not remembered."""
        if not supported_families(target):
            return Decision(FALLBACK, f"{device.name}: {unsupported_reason(target)}")
        decided_for, tuned = self._decision_problem(problem, device)
        options, problems = self._candidates(decided_for, device, target)
        return _for_class(self._first(options, problems, target, None), decided_for, tuned)
