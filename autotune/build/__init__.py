"""Stage 2, build: a validated config to a cubin. Code generation, the CUDA toolchain, nvcc,
ptxas resource reports and the content-addressed cubin cache. Imports only `model`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:  # resolved lazily at run time (__getattr__), typed for checkers here
    from .cache import ArtifactCache, artifact_key
    from .compiler import (
        NVCC_FLAGS,
        BuildResult,
        compile_config,
        compile_many,
        default_jobs,
        lookup,
    )
    from .toolchain import (
        Toolchain,
        ToolchainError,
        family_source_hash,
        find_cuda_include,
        find_nvcc,
        kernel_source_hash,
    )
    from .toolchain import (
        toolchain as current_toolchain,
    )

# The names scripts and other callers may import from this stage; each is loaded on first
# use from its module, so importing one module of the stage does not load the others.
__all__ = [
    "ArtifactCache",
    "BuildResult",
    "NVCC_FLAGS",
    "Toolchain",
    "ToolchainError",
    "artifact_key",
    "compile_config",
    "compile_many",
    "current_toolchain",
    "default_jobs",
    "family_source_hash",
    "find_cuda_include",
    "find_nvcc",
    "kernel_source_hash",
    "lookup",
]

# `current_toolchain` is `toolchain.toolchain` under another name: a package attribute named
# `toolchain` is the submodule once it is imported, so the function cannot be exported as such.

_LAZY: dict[str, tuple[str, str]] = {
    "ArtifactCache": ("cache", "ArtifactCache"),
    "artifact_key": ("cache", "artifact_key"),
    "BuildResult": ("compiler", "BuildResult"),
    "NVCC_FLAGS": ("compiler", "NVCC_FLAGS"),
    "compile_config": ("compiler", "compile_config"),
    "compile_many": ("compiler", "compile_many"),
    "default_jobs": ("compiler", "default_jobs"),
    "lookup": ("compiler", "lookup"),
    "Toolchain": ("toolchain", "Toolchain"),
    "ToolchainError": ("toolchain", "ToolchainError"),
    "find_cuda_include": ("toolchain", "find_cuda_include"),
    "find_nvcc": ("toolchain", "find_nvcc"),
    "family_source_hash": ("toolchain", "family_source_hash"),
    "kernel_source_hash": ("toolchain", "kernel_source_hash"),
    "current_toolchain": ("toolchain", "toolchain"),
}


__getattr__ = lazy_getattr(__name__, _LAZY)
