"""cute-autotune: an autotuning explorer for CuTe FlashAttention-forward kernels."""

from __future__ import annotations

from .compiler import BuildResult, compile_config, compile_many, lookup
from .config import Config, InvalidConfig
from .problem import Problem
from .space import Space, families, load_space, validate_config
from .target import Target, default_target, target_for_arch

__all__ = [
    "BuildResult",
    "Config",
    "InvalidConfig",
    "Problem",
    "Space",
    "Target",
    "compile_config",
    "compile_many",
    "default_target",
    "families",
    "load_space",
    "lookup",
    "target_for_arch",
    "validate_config",
]

__version__ = "0.1.0"
