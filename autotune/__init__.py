"""cute-autotune: an autotuning explorer for CuTe FlashAttention-forward kernels."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .compiler import BuildResult, compile_config, compile_many, lookup
from .config import Config, InvalidConfig
from .problem import Problem
from .search import FamilyOutcome, SearchSettings, TuneOutcome
from .space import Space, families, load_space, supported_families, validate_config
from .target import Target, default_target, target_for_arch
from .tuning import BestAnswer, best_config, tune

if TYPE_CHECKING:  # imported lazily at run time (__getattr__), typed for checkers here
    from .runtime import attention, configure, explain

__all__ = [
    "BestAnswer",
    "BuildResult",
    "Config",
    "FamilyOutcome",
    "InvalidConfig",
    "Problem",
    "SearchSettings",
    "Space",
    "Target",
    "TuneOutcome",
    "attention",
    "best_config",
    "configure",
    "compile_config",
    "compile_many",
    "default_target",
    "explain",
    "families",
    "load_space",
    "lookup",
    "supported_families",
    "target_for_arch",
    "tune",
    "validate_config",
]

__version__ = "0.1.0"

_LAZY = {"attention": "runtime", "explain": "runtime", "configure": "runtime"}


def __getattr__(name: str) -> object:
    # attention pulls in torch (and registers its custom op); `import autotune` for the CLI's
    # compile-only commands should not pay for that.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
