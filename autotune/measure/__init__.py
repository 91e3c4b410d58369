"""Stage 4, measure: is a kernel right, and how fast is it. The fp32 reference, the validator,
the timing regime and its environment, torch SDPA as baseline, the crash-isolated GPU worker
and the one trial every measurement goes through. Imports `model`, `build` and `launch`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:  # resolved lazily at run time (__getattr__), typed for checkers here
    from .gpu_tasks import describe_device, time_sdpa
    from .inputs import length_mask, problem_inputs
    from .kvcache_inputs import KVCase, make_kv_inputs
    from .reference import reference_attention, reference_with_kvcache
    from .sdpa import accepted_backends, sdpa_call
    from .timing import input_sets_needed, measure
    from .trial import check, evaluate, remember_verdict
    from .validate import ValidationReport
    from .worker import GpuWorker

# The names scripts and other callers may import from this stage; each is loaded on first
# use from its module, so importing one module of the stage does not load the others.
__all__ = [
    "GpuWorker",
    "KVCase",
    "ValidationReport",
    "accepted_backends",
    "check",
    "describe_device",
    "evaluate",
    "input_sets_needed",
    "length_mask",
    "make_kv_inputs",
    "measure",
    "problem_inputs",
    "reference_attention",
    "reference_with_kvcache",
    "remember_verdict",
    "sdpa_call",
    "time_sdpa",
]

_LAZY: dict[str, tuple[str, str]] = {
    "input_sets_needed": ("timing", "input_sets_needed"),
    "KVCase": ("kvcache_inputs", "KVCase"),
    "make_kv_inputs": ("kvcache_inputs", "make_kv_inputs"),
    "measure": ("timing", "measure"),
    "accepted_backends": ("sdpa", "accepted_backends"),
    "sdpa_call": ("sdpa", "sdpa_call"),
    "reference_attention": ("reference", "reference_attention"),
    "reference_with_kvcache": ("reference", "reference_with_kvcache"),
    "length_mask": ("inputs", "length_mask"),
    "problem_inputs": ("inputs", "problem_inputs"),
    "describe_device": ("gpu_tasks", "describe_device"),
    "time_sdpa": ("gpu_tasks", "time_sdpa"),
    "check": ("trial", "check"),
    "evaluate": ("trial", "evaluate"),
    "remember_verdict": ("trial", "remember_verdict"),
    "GpuWorker": ("worker", "GpuWorker"),
    "ValidationReport": ("validate", "ValidationReport"),
}


__getattr__ = lazy_getattr(__name__, _LAZY)
