"""Refit the performance model of one GPU model over a tuning database and keep it there
(store.perf_models): what `tune`, `import` and `model fit --store` do after adding measurements.

The data are every successful measurement of the GPU model in the database and, for problems
known only by their best result (imported, or seeded from db/), that result and the SDPA
timings beside it. A refit over the same data as the stored model is skipped (the digest of the
timings says so); past MAX_TIMINGS timings, a fixed subset chosen by each timing's hash is
fitted, so the refit that follows a tuning session stays within seconds to a minute on a
laptop's CPU. scikit-learn fits; without it nothing is refitted and the outcome says how to get
it (the stored or shipped model still predicts: that needs no fitting library).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from ..store.perf_models import PerfModels
from ..store.repo import TuningStore
from .fit_model import Timing, data_digest, fit, timings_of, timings_of_results

MAX_TIMINGS = 5000
MIN_TIMINGS = 20
REFIT_TREES = 100  # trees per quantile: `model fit`'s default is 200; held-out error alike


@dataclass(frozen=True)
class RefitOutcome:
    device: str
    status: str  # fitted | unchanged | too few | no scikit-learn
    timings: int
    message: str


def database_timings(store: TuningStore, device: str) -> list[Timing]:
    """The timings of `device` (a GPU model's name) the database holds: its measurements, then
    the best results (and their SDPA timings) of config-problem pairs not measured here."""
    measured = timings_of(store.trials(), device)
    seen = {(t.problem, t.config) for t in measured}
    results = timings_of_results(store.export(device)["results"], device)
    return measured + [t for t in results if (t.problem, t.config) not in seen]


def fitted_subset(data: list[Timing], limit: int = MAX_TIMINGS) -> list[Timing]:
    """`data`, or the `limit` timings of it whose hash is smallest (the same ones for the same
    data, whatever its order)."""
    if len(data) <= limit:
        return data

    def key(t: Timing) -> str:
        line = json.dumps(
            [t.problem.as_dict(), t.config.to_json(), round(t.median_us, 6)], sort_keys=True
        )
        return hashlib.sha256(line.encode()).hexdigest()

    return sorted(data, key=key)[:limit]


def refit(
    store: TuningStore, device: str, fitted_by: str, *, trees: int = REFIT_TREES, depth: int = 4
) -> RefitOutcome:
    """Fit `device`'s model over `store` and keep it there, unless the data are those of the
    stored model already, too few, or scikit-learn is missing."""
    try:
        import sklearn  # noqa: F401
    except ImportError:
        return RefitOutcome(
            device,
            "no scikit-learn",
            0,
            "the performance model was not refitted: scikit-learn is not "
            "installed (pip install scikit-learn)",
        )
    data = fitted_subset(database_timings(store, device))
    if len(data) < MIN_TIMINGS:
        return RefitOutcome(
            device,
            "too few",
            len(data),
            f"the performance model of {device} was not fitted: "
            f"{len(data)} timings in the database ({MIN_TIMINGS} at least)",
        )
    models = PerfModels(store)
    stored = models.describe(device)
    if stored is not None and stored.data_digest == data_digest(data):
        return RefitOutcome(
            device,
            "unchanged",
            len(data),
            f"the performance model of {device} is up to date ({len(data)} timings)",
        )
    models.save(fit(data, device, trees=trees, depth=depth), fitted_by)
    return RefitOutcome(
        device,
        "fitted",
        len(data),
        f"refitted the performance model of {device} over {len(data)} "
        f"timings of {_count(len({t.problem for t in data}), 'problem')}",
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
