"""cute-autotune: an autotuning explorer for CuTe FlashAttention-forward kernels."""

from __future__ import annotations

from .compiler import BuildResult, compile_config, compile_many, lookup
from .config import Config, InvalidConfig
from .problem import Problem
from .search import SearchSettings, TuneOutcome
from .space import Space, families, load_space, validate_config
from .target import Target, default_target, target_for_arch
from .tuning import BestAnswer, best_config, tune

__all__ = [
    "BestAnswer",
    "BuildResult",
    "Config",
    "InvalidConfig",
    "Problem",
    "SearchSettings",
    "Space",
    "Target",
    "TuneOutcome",
    "best_config",
    "compile_config",
    "compile_many",
    "default_target",
    "families",
    "load_space",
    "lookup",
    "target_for_arch",
    "tune",
    "validate_config",
]

__version__ = "0.1.0"
