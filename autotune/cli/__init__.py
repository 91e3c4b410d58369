"""Stage 8, cli: the `cute-autotune` command, its tables, the demo, bench and report. May
import every stage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:  # resolved lazily at run time (__getattr__), typed for checkers here
    from .bench import bench_problem, geomean, summarize
    from .table import render_table

# The names scripts and other callers may import from this stage; each is loaded on first
# use from its module, so importing one module of the stage does not load the others.
__all__ = [
    "bench_problem",
    "geomean",
    "render_table",
    "summarize",
]

_LAZY: dict[str, tuple[str, str]] = {
    "render_table": ("table", "render_table"),
    "bench_problem": ("bench", "bench_problem"),
    "geomean": ("bench", "geomean"),
    "summarize": ("bench", "summarize"),
}


__getattr__ = lazy_getattr(__name__, _LAZY)
