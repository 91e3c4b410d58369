"""Stage 1, model: what is tuned and for what. Kernel configs and their validation against a
family's search space, the attention problem, compile targets, shape sets and the occupancy
arithmetic. Pure Python: no torch, no nvcc, no database."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:  # resolved lazily at run time (__getattr__), typed for checkers here
    from .config import Config, InvalidConfig
    from .occupancy import ctas_per_sm
    from .perf_model import PerfModel
    from .problem import Problem
    from .sampling import covering_sample
    from .shapes import load_shape_set
    from .space import Space, families, load_space, supported_families, validate_config
    from .target import Target, default_target, target_for_arch, target_for_device

# The names scripts and other callers may import from this stage; each is loaded on first
# use from its module, so importing one module of the stage does not load the others.
__all__ = [
    "Config",
    "InvalidConfig",
    "PerfModel",
    "Problem",
    "Space",
    "Target",
    "covering_sample",
    "ctas_per_sm",
    "default_target",
    "families",
    "load_shape_set",
    "load_space",
    "supported_families",
    "target_for_arch",
    "target_for_device",
    "validate_config",
]

_LAZY: dict[str, tuple[str, str]] = {
    "Config": ("config", "Config"),
    "InvalidConfig": ("config", "InvalidConfig"),
    "Problem": ("problem", "Problem"),
    "PerfModel": ("perf_model", "PerfModel"),
    "Space": ("space", "Space"),
    "families": ("space", "families"),
    "load_space": ("space", "load_space"),
    "supported_families": ("space", "supported_families"),
    "validate_config": ("space", "validate_config"),
    "Target": ("target", "Target"),
    "default_target": ("target", "default_target"),
    "target_for_arch": ("target", "target_for_arch"),
    "target_for_device": ("target", "target_for_device"),
    "load_shape_set": ("shapes", "load_shape_set"),
    "covering_sample": ("sampling", "covering_sample"),
    "ctas_per_sm": ("occupancy", "ctas_per_sm"),
}


__getattr__ = lazy_getattr(__name__, _LAZY)
