"""Stage 5, store: the tuning database. SQLAlchemy 2 models, schema versions and migrations,
export/import, and the operations on them (one transaction per operation). Imports `model`,
`build` (cache keys) and `measure`'s environment record."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:  # resolved lazily at run time (__getattr__), typed for checkers here
    from .repo import TuningStore, problem_distance

# The names scripts and other callers may import from this stage; each is loaded on first
# use from its module, so importing one module of the stage does not load the others.
__all__ = [
    "TuningStore",
    "problem_distance",
]

_LAZY: dict[str, tuple[str, str]] = {
    "TuningStore": ("repo", "TuningStore"),
    "problem_distance": ("repo", "problem_distance"),
}


__getattr__ = lazy_getattr(__name__, _LAZY)
