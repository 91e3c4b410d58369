"""Operations on the tuning database, one facade over its parts: measurements and baselines
(store.trial_rows), best configs and their lookups (store.best_rows), export and import
(store.import_rows), runtime misses (store.miss_rows), all on one engine (store.base). Each
public method owns exactly one transaction."""

from __future__ import annotations

from .exchange import BrokenRow
from .import_rows import ImportRows
from .miss_rows import MissRows
from .row_helpers import problem_distance
from .trial_rows import TrialRows

__all__ = ["BrokenRow", "TuningStore", "problem_distance"]


class TuningStore(TrialRows, ImportRows, MissRows):
    """The tuning database. `create=False` opens it for reading only (`list`, `best`,
    `export`): a database that does not exist is an error, not a new empty one. Every database
    error a method meets is a StoreError naming the database."""
