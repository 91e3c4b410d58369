"""Stage 7, tune: search. Strategies propose configs, one loop evaluates each through the
measure stage, records it in the store and tells the strategy; backends run trials live on a
GPU or replay a recording. Imports every earlier stage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:  # resolved lazily at run time (__getattr__), typed for checkers here
    from .backends import SDPA_FAMILY, GpuBackend, ReplayBackend
    from .fit_model import fit as fit_perf_model
    from .fit_model import timings_of_recording
    from .loop import Progress
    from .search import rerank_finalists, sdpa_configs, study_name, tune_problem
    from .settings import SearchSettings
    from .tuning import best_config, tune
    from .worker import run_worker

# The names scripts and other callers may import from this stage; each is loaded on first
# use from its module, so importing one module of the stage does not load the others.
__all__ = [
    "GpuBackend",
    "Progress",
    "ReplayBackend",
    "SDPA_FAMILY",
    "SearchSettings",
    "best_config",
    "fit_perf_model",
    "rerank_finalists",
    "run_worker",
    "sdpa_configs",
    "study_name",
    "timings_of_recording",
    "tune",
    "tune_problem",
]

_LAZY: dict[str, tuple[str, str]] = {
    "best_config": ("tuning", "best_config"),
    "tune": ("tuning", "tune"),
    "SearchSettings": ("settings", "SearchSettings"),
    "Progress": ("loop", "Progress"),
    "SDPA_FAMILY": ("backends", "SDPA_FAMILY"),
    "GpuBackend": ("backends", "GpuBackend"),
    "ReplayBackend": ("backends", "ReplayBackend"),
    "rerank_finalists": ("search", "rerank_finalists"),
    "sdpa_configs": ("search", "sdpa_configs"),
    "study_name": ("search", "study_name"),
    "tune_problem": ("search", "tune_problem"),
    "run_worker": ("worker", "run_worker"),
    "fit_perf_model": ("fit_model", "fit"),
    "timings_of_recording": ("fit_model", "timings_of_recording"),
}


__getattr__ = lazy_getattr(__name__, _LAZY)
