"""The build a runtime call runs, from wherever it can come: the cubin cache, else the installed
kernel pack, else nvcc.

Tuning measures what the current toolchain builds (`compile_config`); a call of `attention()`
needs only a cubin of the right config, kernel sources and GPU. On a machine without the CUDA
toolkit the cache cannot even be asked (its keys hold nvcc's version), so the kernel pack, keyed
by what a cubin is (pack.py), answers there. The pack is asked before nvcc runs anywhere: its
cubin is the one the shipped results were tuned with, and it saves a first call the 20-60 s of
a compile. A config found nowhere and not compilable is an outcome, not an exception: a build
of status "infrastructure" (the machine lacks something; the config is not at fault) whose
message says what is missing, which dispatch keeps as its reason to pass the config over.
"""

from __future__ import annotations

from ..model.space import ValidConfig
from ..model.status import Status
from ..model.target import Target
from .cache import ArtifactCache
from .compiler import BuildResult, cached_build, compile_config
from .pack import find_pack
from .toolchain import ToolchainError


def obtain(
    config: ValidConfig,
    target: Target,
    *,
    compile_on_miss: bool = True,
    cache: ArtifactCache | None = None,
) -> BuildResult:
    """The build of `config` for `target`: cached, prebuilt in the kernel pack, or compiled now
    (when nvcc is here and `compile_on_miss`); else a failed build saying why there is none.

    `config` is one its caller found fitting `target` (dispatch's options are; decode_kernel
    checks its own): only a compile checks that again, before nvcc runs."""
    space = config.space
    if not space.compiled:  # torch's own SDPA: answered without a toolchain
        return compile_config(config, target, cache)
    cache = cache or ArtifactCache()
    try:
        cached = cached_build(config, target, cache)
        missing = ""
    except ToolchainError as exc:  # no nvcc: its version is part of every cache key
        cached, missing = None, str(exc)
    if cached is not None:
        return cached
    pack, why = find_pack()
    if pack is not None:
        answer = pack.lookup(config, target)
        if answer.build is not None:
            return answer.build
        why = answer.reason
    name = space.name_of(config)
    if missing:
        return BuildResult(
            config,
            target.arch,
            Status.INFRASTRUCTURE,
            message=f"{name} has no build here and cannot be compiled: {missing}; {why}",
        )
    if not compile_on_miss:
        return BuildResult(
            config,
            target.arch,
            Status.INFRASTRUCTURE,
            message=f"{name} is not compiled and compile-on-miss is off; {why}",
        )
    return compile_config(config, target, cache)
