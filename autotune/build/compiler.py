"""Compile configs to cubins on demand: static check, cache lookup, nvcc, ptxas report.

A config that cannot compile is an outcome, not an exception: every path returns a BuildResult
whose status says what happened ("ok", "invalid" = pruned by the space's static constraints
before nvcc, "compile_error" with nvcc's message, "timeout"). A compile worker process that
dies (the OOM killer, a signal) is not the config's doing: its configs are compiled again in a
fresh pool, and after repeated breakage they come back as "infrastructure", which no caller
records against the config. Cubins are device code only, so they build on machines without a
GPU and do not depend on the Python or torch version.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .._paths import cache_dir, kernel_src_dir
from ..model.config import Config, InvalidConfig
from ..model.space import ValidConfig, load_space
from ..model.status import Status
from ..model.target import Target, default_target
from .cache import RECORD, ArtifactCache, CacheEntry, artifact_key
from .cache_bound import configured_limit, prune
from .codegen import render
from .cubin import CubinError, LaunchInfo, read_launch_info
from .ptxas import PtxasParseError, PtxasReport, parse_ptxas
from .toolchain import Toolchain, family_source_hash, toolchain

# Part of every cache key: change a flag and every artifact is rebuilt.
NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "--use_fast_math",
    "--expt-relaxed-constexpr",
    "-DNDEBUG",
    "-Xptxas=-v",
]
DEFAULT_TIMEOUT_S = 900.0
# Pools tried before the configs of a broken one are given up as "infrastructure"; the last
# attempt compiles them one at a time, so one config that takes its worker down cannot take
# the others with it.
POOL_ATTEMPTS = 3

# Build keys of torch SDPA configs, which have nothing to build: the versions their speed
# depends on (torch, cuDNN) are stored with each of their timings instead.
TORCH_KEY_PREFIX = "torch-"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildResult:
    config: Config
    arch: str
    status: Status
    key: str | None = None
    cubin: Path | None = None
    ptxas: PtxasReport | None = None
    launch_info: LaunchInfo | None = None
    seconds: float = 0.0  # nvcc wall time (for a cache hit: of the original build)
    cached: bool = False
    message: str = ""
    record: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        # A build made elsewhere (a recording, a test) may name its status by the stored string.
        object.__setattr__(self, "status", Status(self.status))

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def name(self) -> str:
        return load_space(self.config.family).name_of(self.config)


def nvcc_command(tools: Toolchain, gencode: str, source: Path, output: Path) -> list[str]:
    return [
        str(tools.nvcc),
        *NVCC_FLAGS,
        "-cubin",
        f"-gencode={gencode}",
        f"-I{kernel_src_dir()}",
        f"-I{tools.cutlass_include}",
        "-o",
        str(output),
        str(source),
    ]


def summarize_nvcc_errors(stderr: str, limit: int = 4000) -> str:
    """static_assert reasons first (they are the readable ones), then the first error lines."""
    asserts = re.findall(r'static assertion failed with "([^"]+)"', stderr)
    errors = [line.strip() for line in stderr.splitlines() if "error" in line]
    parts = [f"static_assert: {a}" for a in dict.fromkeys(asserts)]
    parts += [e for e in errors if "static assertion failed" not in e][:20]
    text = "\n".join(parts) or stderr.strip()
    return text[:limit]


def _result_from_entry(
    config: Config, target: Target, key: str, entry: CacheEntry, cached: bool
) -> BuildResult:
    rec = entry.record
    return BuildResult(
        config=config,
        arch=target.arch,
        status=Status.OK,
        key=key,
        cubin=entry.cubin,
        ptxas=PtxasReport(**rec["ptxas"]),
        launch_info=LaunchInfo(**rec["launch_info"]),
        seconds=float(rec.get("compile_seconds", 0.0)),
        cached=cached,
        record=rec,
    )


def _cached(config: Config, target: Target, key: str, cache: ArtifactCache) -> BuildResult | None:
    """The verified cache entry of `key` as a build, or None (a record that does not describe a
    build is evicted like a damaged cubin)."""
    entry = cache.get(config.family, key)
    if entry is None:
        return None
    try:
        return _result_from_entry(config, target, key, entry, cached=True)
    except (KeyError, TypeError, ValueError) as exc:
        cache.evict(entry.directory, f"{RECORD} does not describe a build ({exc!r})")
        return None


def build_key(config: Config, target: Target) -> str:
    """The artifact key a build of `config` for `target` gets from the current kernel sources,
    toolchain and flags (what the cache and the tuning database know a build by)."""
    space = load_space(config.family)
    if not space.compiled:
        return f"{TORCH_KEY_PREFIX}{config.digest}"
    return artifact_key(
        space.build_view(space.validate(config)),
        space.gencode_for(target),
        family_source_hash(space),
        toolchain(),
        NVCC_FLAGS,
    )


def _fit(config: Config, target: Target) -> tuple[ValidConfig | None, list[str]]:
    """`config` as its space's ValidConfig (checked here unless it is one already), and why it
    cannot run on `target` (empty when it can). An unknown family raises InvalidConfig."""
    space = load_space(config.family)
    try:
        valid = space.validate(config)
    except InvalidConfig as exc:
        return None, exc.reasons
    return valid, space.violations(valid, target)


def cached_build(config: ValidConfig, target: Target, cache: ArtifactCache) -> BuildResult | None:
    """The cached build of a config that fits `target` (not checked again), or None; raises
    ToolchainError where there is no toolchain to compute the key with."""
    if not config.space.compiled:
        return _nothing_to_build(config, target)
    return _cached(config, target, build_key(config, target), cache)


def lookup(
    config: Config, target: Target, cache: ArtifactCache | None = None
) -> BuildResult | None:
    """The cached build of a valid config, or None. Runs no subprocess."""
    valid, reasons = _fit(config, target)
    if valid is None or reasons:
        return None
    return cached_build(valid, target, cache or ArtifactCache())


def compile_config(
    config: Config,
    target: Target | None = None,
    cache: ArtifactCache | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    force: bool = False,
) -> BuildResult:
    """Build one config (or return its cached build); a plain config is validated first, a
    ValidConfig is taken as it is (only its fit to `target` is checked)."""
    target = target or default_target()
    cache = cache or ArtifactCache()
    valid, reasons = _fit(config, target)
    if valid is None or reasons:
        return BuildResult(config, target.arch, Status.INVALID, message="; ".join(reasons))
    config, space = valid, valid.space
    if not space.compiled:
        return _nothing_to_build(config, target)
    tools = toolchain()
    gencode = space.gencode_for(target)
    built = space.build_view(config)  # the binary: launch parameters do not reach it
    key = artifact_key(built, gencode, family_source_hash(space), tools, NVCC_FLAGS)
    if not force and (hit := _cached(config, target, key, cache)) is not None:
        return hit
    cache.ensure_writable()  # before nvcc: a build that cannot be stored is not started
    limit = configured_limit()  # and a bad limit setting stops it there too
    # What the build is made with; a failure carries it too, so that the database records the
    # toolchain a config failed under (a new one tries it again).
    made_with = {
        "toolchain": {
            "nvcc": tools.nvcc_version,
            "cutlass": tools.cutlass_version,
            "kernel_source": family_source_hash(space),
        }
    }

    source = render(built)
    with cache.work_dir() as tmp:  # in the cache: one a killed build leaves is removed
        src = tmp / f"{source.name}.cu"
        out = tmp / "kernel.cubin"
        src.write_text(source.text)
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                nvcc_command(tools, gencode, src, out),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return BuildResult(
                config,
                target.arch,
                Status.TIMEOUT,
                key=key,
                seconds=time.perf_counter() - start,
                message=f"nvcc did not finish in {timeout:.0f} s",
                record=made_with,
            )
        seconds = time.perf_counter() - start
        if proc.returncode != 0 or not out.is_file():
            return BuildResult(
                config,
                target.arch,
                Status.COMPILE_ERROR,
                key=key,
                seconds=seconds,
                message=summarize_nvcc_errors(proc.stderr),
                record=made_with,
            )
        cubin = out.read_bytes()
    try:
        report = parse_ptxas(proc.stderr, space.entry_symbol)
        info = read_launch_info(cubin, space.info_symbol)
    except (PtxasParseError, CubinError) as exc:
        return BuildResult(
            config,
            target.arch,
            Status.COMPILE_ERROR,
            key=key,
            seconds=seconds,
            message=f"nvcc succeeded but its output is unusable: {exc}",
            record=made_with,
        )
    record = {
        "key": key,
        "config": built.as_dict(),
        "name": source.name,
        "arch": target.arch,
        "gencode": gencode,
        "flags": NVCC_FLAGS,
        **made_with,
        "ptxas": report.as_dict(),
        "launch_info": info.as_dict(),
        "compile_seconds": round(seconds, 3),
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    entry = cache.put(
        config.family, key, cubin, record, {f"{source.name}.cu": source.text}, replace=force
    )
    try:
        prune(cache, limit, flags=NVCC_FLAGS, keep=[entry.directory])
    except OSError as exc:  # a cache another process prunes meanwhile: the build stands
        log.warning("cubin cache: could not hold its size limit: %s", exc)
    return _result_from_entry(config, target, key, entry, cached=False)


def _nothing_to_build(config: Config, target: Target) -> BuildResult:
    """The "build" of a torch SDPA config: ready to run, no cubin (key=None: no build row)."""
    return BuildResult(
        config,
        target.arch,
        Status.OK,
        cached=True,
        message="torch SDPA backend: nothing to compile",
    )


def _compile_in_worker(
    config_json: str, target: Target, cache_root: str, timeout: float, force: bool
) -> BuildResult:
    return compile_config(
        Config.from_json(config_json), target, ArtifactCache(Path(cache_root)), timeout, force
    )


def _compile_in_pools(
    configs: Sequence[Config],
    pending: list[int],
    results: list[BuildResult | None],
    target: Target,
    cache: ArtifactCache,
    jobs: int,
    timeout: float,
    force: bool,
    on_result: Callable[[BuildResult], None] | None,
) -> None:
    """Compile `configs[i]` for each pending i into `results`, in process pools; the configs
    of a pool that broke go to a fresh one (the last attempt one config at a time)."""
    cache_root = str(cache.root.parent)
    context = multiprocessing.get_context("spawn")  # never fork a process that holds CUDA
    why = ""
    for attempt in range(1, POOL_ATTEMPTS + 1):
        if not pending:
            return
        workers = 1 if attempt == POOL_ATTEMPTS else min(jobs, len(pending))
        broken: list[int] = []
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            futures = {
                pool.submit(
                    _compile_in_worker, configs[i].to_json(), target, cache_root, timeout, force
                ): i
                for i in pending
            }
            for future in as_completed(futures):
                i = futures[future]
                try:
                    result = future.result()
                except BrokenProcessPool as exc:
                    broken.append(i)
                    why = str(exc)
                    continue
                # the build of this process's config: validity does not travel through pickle
                results[i] = result = replace(result, config=configs[i])
                if on_result:
                    on_result(result)
        if broken and attempt < POOL_ATTEMPTS:
            log.warning(
                "a compile worker process died (%s); %d configs go to a fresh pool "
                "(attempt %d of %d)",
                why,
                len(broken),
                attempt + 1,
                POOL_ATTEMPTS,
            )
        pending = sorted(broken)
    for i in pending:
        results[i] = BuildResult(
            configs[i],
            target.arch,
            Status.INFRASTRUCTURE,
            message=f"the compile worker process died in {POOL_ATTEMPTS} pools ({why}); this "
            "says nothing about the config, which is compiled again next time",
        )
        if on_result:
            on_result(results[i])  # type: ignore[arg-type]


def default_jobs() -> int:
    env = os.environ.get("CUTE_AUTOTUNE_JOBS")
    return max(1, int(env)) if env else max(1, os.cpu_count() or 1)


def compile_many(
    configs: Sequence[Config],
    target: Target | None = None,
    *,
    jobs: int | None = None,
    cache: ArtifactCache | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    force: bool = False,
    on_result: Callable[[BuildResult], None] | None = None,
) -> list[BuildResult]:
    """Build many configs, cache misses in a process pool; results in input order.

    Static pruning and cache hits are answered in this process first, so the pool only ever sees
    configs that need nvcc. Each worker process drives one nvcc at a time.
    """
    target = target or default_target()
    cache = cache or ArtifactCache()
    results: list[BuildResult | None] = [None] * len(configs)
    checked: list[Config] = list(configs)  # each validated once here, a ValidConfig from then on
    pending: list[int] = []
    for i, config in enumerate(configs):
        valid, reasons = _fit(config, target)
        if valid is None or reasons:
            results[i] = BuildResult(
                config, target.arch, Status.INVALID, message="; ".join(reasons)
            )
        elif not force and (hit := cached_build(valid, target, cache)) is not None:
            results[i] = hit
        else:
            checked[i] = valid
            pending.append(i)
            continue
        if on_result:
            on_result(results[i])  # type: ignore[arg-type]

    if pending:
        cache.ensure_writable()
        # Configs that differ only in launch parameters share one build: compile the first,
        # answer the others from it.
        first: dict[str, int] = {}
        shared: dict[int, int] = {}
        for i in pending:
            pending_config = checked[i]
            assert isinstance(pending_config, ValidConfig)
            view = pending_config.space.build_view(pending_config).digest
            if view in first:
                shared[i] = first[view]
            else:
                first[view] = i
        _compile_in_pools(
            checked,
            [i for i in pending if i not in shared],
            results,
            target,
            cache,
            jobs or default_jobs(),
            timeout,
            force,
            on_result,
        )
        for i, j in shared.items():
            source = results[j]
            assert source is not None
            results[i] = answered = replace(source, config=configs[i])
            if on_result:
                on_result(answered)
    return [r for r in results if r is not None]


__all__ = [
    "BuildResult",
    "compile_config",
    "compile_many",
    "lookup",
    "cache_dir",
]
