"""A kernel family's search space, declared in search_spaces/<family>.toml.

The space file is the family's whole description as far as Python is concerned: its parameters
(problem-bound or tunable) with their allowed values, derived quantities, static constraints,
and how a config becomes C++ (header, traits template, entry macro, nvcc target). Search, storage
and codegen only talk to this class, so a new family is a new file, not a new code path.

A config is checked against its family's domain once, where it enters (`Space.validate`: the
command line, an import, a stored row read back, the search's proposals, the space's own
heuristic), and travels from there as a `ValidConfig`, which carries its Space: build key,
compile, codegen and naming take it as it is. Whether it fits a GPU (`violations` with a
target) is another question, asked where a target is known.
"""

from __future__ import annotations

import itertools
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from .._paths import search_spaces_dir
from .._shown import shown
from . import expressions as _expr
from .config import Config, InvalidConfig, Value, check_family_name
from .problem import Problem, page_size_of
from .target import Target

PROBLEM = "problem"
TUNABLE = "tunable"
# A tunable parameter of the launch, not of the binary (the decode family's KV split count):
# the tuner searches it and the store keeps it with the config, but it is no template
# parameter, so every value of it shares one build (`Space.build_view`).
LAUNCH = "launch"
# The family whose "configs" are torch SDPA's backends: timed and stored like a kernel family,
# never compiled (search_spaces/sdpa.toml).
SDPA_FAMILY = "sdpa"
# What a family's configs are: CuTe kernels compiled by nvcc, or torch's own SDPA backends
# (the `sdpa` pseudo-family: nothing to compile, always a finalist of the re-ranking).
CUDA, TORCH = "cuda", "torch"
# What a family computes: the attention forward (dispatch, tuning and the runtime choose among
# these) or its backward (dQ, dK, dV; kept apart in search_spaces/backward/, so no forward
# path ever sees one).
FORWARD, BACKWARD = "forward", "backward"
# The symbols of a compiled family's cubin: its main entry (what ptxas reports on) and its
# LaunchInfo, per direction (kernel_src/common/launch_info.h, kernel_src/bwd/kernel.cuh).
ENTRY_SYMBOLS = {FORWARD: "cute_autotune_fwd", BACKWARD: "cute_autotune_bwd"}
INFO_SYMBOLS = {FORWARD: "cute_autotune_fwd_info", BACKWARD: "cute_autotune_bwd_info"}


@dataclass(frozen=True)
class Param:
    name: str
    role: str  # PROBLEM, TUNABLE or LAUNCH
    values: tuple[Value, ...]
    cpp: tuple[tuple[str, str], ...] = ()  # enum value -> C++ spelling (strings only)
    labels: tuple[tuple[str, str], ...] = ()  # value -> short label used in config names
    doc: str = ""
    # What a config stored before this parameter existed meant (the space file's `default`): such
    # a config reads as having this value. None: the parameter is required.
    default: Value | None = None

    def cpp_literal(self, value: Value) -> str:
        """The C++ spelling of an allowed value. Only whitelisted values ever get here."""
        if value not in self.values:
            raise InvalidConfig(
                [f"{self.name} = {shown(value)} is not one of {list(self.values)}"]
            )
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            return str(int(value))
        spelled = dict(self.cpp).get(value)
        if spelled is None:
            raise InvalidConfig(
                [f"{self.name} = {shown(value)} has no C++ spelling in the space file"]
            )
        return spelled

    def label(self, value: Value) -> str:
        key = str(value).lower() if isinstance(value, bool) else str(value)
        return dict(self.labels).get(key, key)


@dataclass(frozen=True)
class Constraint:
    expr: str
    message: str


def _same_kind(value: Any, allowed: tuple[Value, ...]) -> bool:
    # bool is an int in Python; a JSON `1` must not pass for `true` or the reverse.
    return any(type(value) is type(a) and value == a for a in allowed)


@dataclass(frozen=True, eq=False, init=False)
class ValidConfig(Config):
    """A config its family's space accepted: every parameter present, every value allowed.

    Made only by `Space.validate` (which hands one it is given back as it is), so code that
    holds one need not check it again. It is a Config (equal to, and hashed like, the plain
    config of the same values); `space` is the Space that accepted it. Device limits are not
    part of it: `Space.violations(config, target)` says whether it fits a GPU.

    Validity does not cross a process boundary: pickled, it is a plain Config, checked again
    where it arrives.
    """

    space: Space = field(repr=False)

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a ValidConfig is made by Space.validate (or validate_config)")

    @classmethod
    def _accepted(cls, config: Config, space: Space) -> ValidConfig:
        made = object.__new__(cls)
        object.__setattr__(made, "family", config.family)
        object.__setattr__(made, "values", config.values)
        object.__setattr__(made, "space", space)
        return made

    def __reduce__(self) -> tuple[type[Config], tuple[str, tuple[tuple[str, Value], ...]]]:
        return Config, (self.family, self.values)


def read_toml(path: Path) -> dict[str, Any]:
    """A TOML file's table; a file that does not parse is a ValueError naming it and where."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML ({exc})") from None


class Space:
    def __init__(self, data: Mapping[str, Any], source: str = "<memory>") -> None:
        self.source = source
        try:
            self.family: str = data["family"]
            self.kind: str = data.get("kind", CUDA)
            self.direction: str = data.get("direction", FORWARD)
            self.description: str = data.get("description", "")
            self.min_cc: int = int(data.get("min_compute_capability", 0))
            self.max_cc: int = int(data.get("max_compute_capability", 10_000))
            # Which family's built-in default dispatch prefers when several could run a problem
            # that nobody tuned (the highest wins); tuned results choose by measurement instead.
            self.dispatch_priority: int = int(data.get("dispatch_priority", 0))
            # The longest query a family is meant for (decode: a few tokens); tuning sessions
            # search it only on problems within. None: any.
            max_lq = data.get("max_seqlen_q")
            self.max_seqlen_q: int | None = None if max_lq is None else int(max_lq)
            # Whether its kernels read KV caches (per-sequence lengths, pages): only such a
            # family can run a problem whose kv_cache is not "dense".
            self.kv_caches: bool = bool(data.get("kv_caches", False))
            # The shortest page it reads (a TMA kernel loads a page as whole swizzle atoms).
            self.min_page_size: int = int(data.get("min_page_size", 1))
            # Other families' folders of kernel_src/ whose headers this family's kernels
            # include: part of its build key, so a change there rebuilds its cubins.
            self.sources: tuple[str, ...] = tuple(str(s) for s in data.get("sources", ()))
            compiled = self.kind == CUDA
            self.gencode: str = data["gencode"] if compiled else ""
            self.header: str = data["header"] if compiled else ""
            self.entry_macro: str = data["entry_macro"] if compiled else ""
            self.traits_template: str = data["traits"] if compiled else ""
            self.name_template: str = data["name"]
            params = [
                Param(
                    name=name,
                    role=spec["role"],
                    values=tuple(spec["values"]),
                    cpp=tuple((str(k), str(v)) for k, v in spec.get("cpp", {}).items()),
                    labels=tuple((str(k), str(v)) for k, v in spec.get("name", {}).items()),
                    doc=spec.get("doc", ""),
                    default=spec.get("default"),
                )
                for name, spec in data["params"].items()
            ]
            self.derived: dict[str, str] = dict(data.get("derived", {}))
            self.constraints = tuple(
                Constraint(c["expr"], c["message"]) for c in data.get("constraints", [])
            )
            self._heuristic: dict[int, dict[str, Value]] = {
                int(k): dict(v) for k, v in data.get("heuristic", {}).items()
            }
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{source}: malformed space file ({exc!r})") from None
        check_family_name(self.family)
        if self.kind not in (CUDA, TORCH):
            raise ValueError(f"{source}: kind {self.kind!r} is not {CUDA!r} or {TORCH!r}")
        if self.direction not in (FORWARD, BACKWARD):
            raise ValueError(
                f"{source}: direction {self.direction!r} is not {FORWARD!r} or {BACKWARD!r}"
            )
        header = Path(self.header)
        if self.kind == CUDA and (
            header.is_absolute() or ".." in header.parts or len(header.parts) < 2
        ):
            raise ValueError(
                f"{source}: header {self.header!r} is not a path inside a family's "
                "folder of kernel_src/"
            )
        for folder in self.sources:
            if Path(folder).name != folder or folder in ("", ".", ".."):
                raise ValueError(
                    f"{source}: sources entry {folder!r} is not a folder name of kernel_src/"
                )
        self.params: dict[str, Param] = {p.name: p for p in params}
        for p in params:
            if p.role not in (PROBLEM, TUNABLE, LAUNCH):
                raise ValueError(f"{source}: parameter {p.name} has unknown role {p.role!r}")
            if p.default is not None and not _same_kind(p.default, p.values):
                raise ValueError(
                    f"{source}: parameter {p.name}'s default {p.default!r} is not "
                    f"one of {list(p.values)}"
                )
        self._check_expressions()

    def _check_expressions(self) -> None:
        known = set(self.params) | {"max_smem_per_block", "cc"}
        for name, expr in self.derived.items():
            unknown = _expr.names_in(expr) - known
            if unknown:
                raise ValueError(f"{self.source}: derived {name} uses unknown {sorted(unknown)}")
            known.add(name)
        for c in self.constraints:
            unknown = _expr.names_in(c.expr) - known
            if unknown:
                raise ValueError(
                    f"{self.source}: constraint {c.expr!r} uses unknown {sorted(unknown)}"
                )

    @classmethod
    def from_file(cls, path: Path) -> Space:
        return cls(read_toml(path), str(path))

    @property
    def compiled(self) -> bool:
        """Whether configs of this family are kernels nvcc builds (not torch's SDPA)."""
        return self.kind == CUDA

    @property
    def entry_symbol(self) -> str:
        """The cubin's main entry, whose ptxas report is the build's."""
        return ENTRY_SYMBOLS[self.direction]

    @property
    def info_symbol(self) -> str:
        """The cubin's LaunchInfo symbol."""
        return INFO_SYMBOLS[self.direction]

    def supports(self, cc: int) -> bool:
        """Whether devices of compute capability `cc` (90 for sm_90) can run this family."""
        return self.min_cc <= cc <= self.max_cc

    def serves(self, seqlen_q: int) -> bool:
        """Whether problems with `seqlen_q` query rows are what this family is meant for."""
        return self.max_seqlen_q is None or seqlen_q <= self.max_seqlen_q

    def reads(self, kv_cache: str) -> bool:
        """Whether this family's kernels can read keys held as `kv_cache` (a Problem's)."""
        if kv_cache == "dense":
            return True
        page = page_size_of(kv_cache)
        return self.kv_caches and (page == 0 or page >= self.min_page_size)

    def cc_range(self) -> str:
        """The compute capabilities this family runs on, in words: "sm_80 and newer"."""
        if self.max_cc >= 10_000:
            return f"sm_{self.min_cc} and newer"
        if self.min_cc == self.max_cc:
            return f"sm_{self.min_cc} only"
        return f"sm_{self.min_cc} to sm_{self.max_cc}"

    # -- parameters -------------------------------------------------------------------------

    @property
    def problem_params(self) -> list[Param]:
        return [p for p in self.params.values() if p.role == PROBLEM]

    def problem_values(self, problem: Problem) -> dict[str, Value]:
        """The values of this family's problem-bound parameters for `problem` (each one is a
        field of the problem)."""
        return {p.name: getattr(problem, p.name) for p in self.problem_params}

    @property
    def tunable_params(self) -> list[Param]:
        """What the tuner searches: template parameters and launch parameters alike."""
        return [p for p in self.params.values() if p.role in (TUNABLE, LAUNCH)]

    @property
    def launch_params(self) -> list[Param]:
        return [p for p in self.params.values() if p.role == LAUNCH]

    def build_view(self, config: ValidConfig) -> ValidConfig:
        """The config whose build `config` runs on: launch parameters at their first value, so
        that configs differing only in them share one key, one cubin and one compile."""
        if not self.launch_params:
            return config
        canonical = {p.name: p.values[0] for p in self.launch_params}
        if all(config[name] == value for name, value in canonical.items()):
            return config
        return self.validate(config.replace(**canonical))

    def config(self, **values: Value) -> ValidConfig:
        """Build and validate a config of this family."""
        return self.validate(Config.make(self.family, values))

    def validate(self, config: Config) -> ValidConfig:
        """Domain check: right family, every parameter present, every value allowed; the
        config as a ValidConfig. One this space already accepted comes back as it is, unchecked.

        Raises InvalidConfig listing every problem. Say nothing of device limits: those are
        `violations(config, target)`.
        """
        if isinstance(config, ValidConfig) and config.space is self:
            return config
        config = self._with_defaults(config)
        reasons = self._domain_reasons(config)
        if reasons:
            raise InvalidConfig(reasons, config)
        return ValidConfig._accepted(config, self)

    def _with_defaults(self, config: Config) -> Config:
        """`config` with the parameters added to the family after it was stored, at the
        value that config meant (each such parameter's `default`)."""
        given = dict(config.values)
        missing = {
            p.name: p.default
            for p in self.params.values()
            if p.name not in given and p.default is not None
        }
        if not missing or config.family != self.family:
            return config
        return Config.make(config.family, {**given, **missing})

    def _domain_reasons(self, config: Config) -> list[str]:
        """Why `config` is not in this space's domain (empty when it is): the one check."""
        if config.family != self.family:
            return [f"config is of family {shown(config.family)}, not {shown(self.family)}"]
        given = dict(config.values)
        reasons = [f"unknown parameter {shown(k)}" for k in given if k not in self.params]
        for p in self.params.values():
            if p.name not in given:
                reasons.append(f"missing parameter {shown(p.name)}")
            elif not _same_kind(given[p.name], p.values):
                reasons.append(f"{p.name} = {shown(given[p.name])} is not one of {list(p.values)}")
        return reasons

    # -- derived values and constraints -----------------------------------------------------

    def environment(self, config: Config, target: Target) -> dict[str, Any]:
        env: dict[str, Any] = dict(config.values)
        env["max_smem_per_block"] = target.max_smem_per_block
        env["cc"] = target.cc
        for name, expr in self.derived.items():
            env[name] = _expr.evaluate(expr, env)
        return env

    def derived_values(self, config: Config, target: Target) -> dict[str, Any]:
        env = self.environment(self.validate(config), target)
        return {name: env[name] for name in self.derived}

    def violations(self, config: Config, target: Target) -> list[str]:
        """Why this config cannot run on `target` (empty when it can); includes domain errors
        (none for a ValidConfig of this space: only the target's limits are evaluated)."""
        try:
            valid = self.validate(config)
        except InvalidConfig as exc:
            return exc.reasons
        if not self.supports(target.cc):
            return [
                f"family {self.family} needs compute capability {self.min_cc}..{self.max_cc}, "
                f"target is {target.arch}"
            ]
        env = self.environment(valid, target)
        return [c.message for c in self.constraints if not _expr.evaluate(c.expr, env)]

    def is_valid(self, config: Config, target: Target) -> bool:
        return not self.violations(config, target)

    # -- enumeration ------------------------------------------------------------------------

    def all_configs(self, fixed: Mapping[str, Value] | None = None) -> Iterator[Config]:
        """Every combination of allowed values (valid or not), with `fixed` parameters pinned."""
        fixed = dict(fixed or {})
        unknown = set(fixed) - set(self.params)
        if unknown:
            raise InvalidConfig([f"unknown parameter {shown(k)}" for k in sorted(unknown)])
        axes: list[tuple[Value, ...]] = []
        for p in self.params.values():
            if p.name in fixed:
                if not _same_kind(fixed[p.name], p.values):
                    raise InvalidConfig(
                        [f"{p.name} = {shown(fixed[p.name])} is not one of {list(p.values)}"]
                    )
                axes.append((fixed[p.name],))
            else:
                axes.append(p.values)
        names = list(self.params)
        for combo in itertools.product(*axes):
            yield Config.make(self.family, dict(zip(names, combo, strict=True)))

    def valid_configs(
        self, target: Target, fixed: Mapping[str, Value] | None = None
    ) -> list[ValidConfig]:
        """Every config of the space (with `fixed` parameters pinned) that fits `target`."""
        fitting = []
        for config in self.all_configs(fixed):
            try:
                valid = self.validate(config)
            except InvalidConfig:
                continue
            if not self.violations(valid, target):
                fitting.append(valid)
        return fitting

    def heuristic(self, problem_values: Mapping[str, Value]) -> ValidConfig | None:
        """The family's untuned default for a problem class (None if it has none)."""
        tile = self._heuristic.get(int(problem_values["head_dim"]))
        if tile is None:
            return None
        return self.validate(Config.make(self.family, {**problem_values, **tile}))

    # -- rendering --------------------------------------------------------------------------

    def name_of(self, config: Config) -> str:
        """The config's name (`name` of the space file); a plain config is validated first."""
        valid = self.validate(config)
        return self.name_template.format(**{k: self.params[k].label(v) for k, v in valid.values})

    def traits_of(self, config: Config) -> str:
        """The C++ traits type of the config; a plain config is validated first."""
        valid = self.validate(config)
        return self.traits_template.format(
            **{k: self.params[k].cpp_literal(v) for k, v in valid.values}
        )

    def gencode_for(self, target: Target) -> str:
        return self.gencode.format(cc=target.cc)


def families() -> list[str]:
    """Every forward kernel family: one per space file in search_spaces/ (read once per
    process: the space files are package data)."""
    return list(_family_names())


def backward_families() -> list[str]:
    """Every backward kernel family: one per space file in search_spaces/backward/."""
    return list(_backward_family_names())


def all_families() -> list[str]:
    """Forward and backward families: what a cubin in the cache can belong to."""
    return [*_family_names(), *_backward_family_names()]


@cache
def _family_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in search_spaces_dir().glob("*.toml")))


@cache
def _backward_family_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in (search_spaces_dir() / BACKWARD).glob("*.toml")))


def kernel_families() -> list[str]:
    """The families of compiled kernels (every family but torch's `sdpa`)."""
    return [f for f in families() if load_space(f).compiled]


def supported_families(target: Target | int) -> list[str]:
    """The kernel families whose kernels run on `target` (a Target or a compute capability),
    by name (torch's `sdpa` pseudo-family is not one: it runs wherever torch does)."""
    cc = target if isinstance(target, int) else target.cc
    return [f for f in kernel_families() if load_space(f).supports(cc)]


def default_config(problem_values: Mapping[str, Value], target: Target) -> ValidConfig | None:
    """The built-in default config for a problem class on `target`: that of the family of
    highest `dispatch_priority` among those the target runs that have a default for the head
    dim (None if none has)."""
    spaces = sorted(
        (load_space(f) for f in supported_families(target)),
        key=lambda s: (-s.dispatch_priority, s.family),
    )
    for space in spaces:
        try:
            config = space.heuristic(problem_values)
        except InvalidConfig:  # a problem value outside this family's space
            continue
        if config is not None:
            return config
    return None


def unsupported_reason(target: Target | int) -> str:
    """Why no family runs on `target`, naming what each family needs."""
    cc = target if isinstance(target, int) else target.cc
    spaces = [load_space(f) for f in kernel_families()]
    needs = ", ".join(f"{s.family} needs {s.cc_range()}" for s in spaces)
    if all(cc < s.min_cc for s in spaces):
        return f"sm_{cc} is older than any kernel family supports ({needs})"
    return f"no kernel family supports sm_{cc} ({needs})"


def load_space(family: str) -> Space:
    """The space of an installed kernel family, forward or backward. `family` is checked to be
    one of the names `all_families()` lists before any path is built from it."""
    known = all_families()
    if check_family_name(family) not in known:
        raise InvalidConfig([f"unknown kernel family {shown(family)}; known: {', '.join(known)}"])
    return _load_space(family)


@cache
def _load_space(family: str) -> Space:
    folder = search_spaces_dir()
    if family in _backward_family_names():
        folder = folder / BACKWARD
    space = Space.from_file(folder / f"{family}.toml")
    if space.family != family:
        raise ValueError(f"{space.source} declares family {space.family!r}")
    expected = BACKWARD if family in _backward_family_names() else FORWARD
    if space.direction != expected:
        raise ValueError(f"{space.source} declares direction {space.direction!r}")
    return space


def class_mismatch(problem: Problem, config: Config) -> dict[str, Value]:
    """What makes `config` (of an installed family) unfit for `problem`: its problem-bound
    values that differ from the problem's (by name, the problem's value), and the pass where it
    is not the problem's (a backward family runs backward problems only, a forward family
    forward ones; torch's SDPA runs both). {} where the config is of the problem's class."""
    space = load_space(config.family)
    mismatch = {k: v for k, v in space.problem_values(problem).items() if config[k] != v}
    if space.compiled and (space.direction == BACKWARD) != problem.backward:
        mismatch["backward"] = problem.backward
    return mismatch


def validate_config(config: Config) -> ValidConfig:
    """Validate a config read from outside (CLI, file, database) against its family's space
    (a ValidConfig of it comes back as it is)."""
    return load_space(config.family).validate(config)
