"""Fit the performance model (`autotune.model.perf_model`) over the measurements in a tuning
database, and say how well it predicts problems it did not see.

The learner is scikit-learn's GradientBoostingRegressor with the quantile loss (one per
quantile: 20th, 50th, 80th percentile of log time): a well-kept library whose fitted trees are
plain arrays, so they are written as JSON and evaluated without it (dispatch never imports
scikit-learn), and whose quantile loss gives each prediction a range without a second model
of the error. Gradient-boosted trees suit the data: a few hundred to a few thousand timings,
features of mixed kinds (sizes, flags, a family), effects that switch at thresholds (a tile that
fits or does not). scikit-learn is needed to fit only: `pip install scikit-learn`.

The held-out error is measured by problem: each fold's problems are left out of its fit, so it
says how the model does on a problem nobody timed, per family.

The model is the forward pass's: a backward problem's timings (`Problem.backward`) are left
out of every fit, as forward dispatch never asks about one.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..build.toolchain import family_source_hash
from ..model.config import Config
from ..model.perf_model import (
    FORMAT,
    QUANTILES,
    VERSION,
    PerfModel,
    config_features,
    digest_of,
    problem_features,
    problem_row,
)
from ..model.problem import Problem
from ..model.space import SDPA_FAMILY, load_space
from ..store.repo import TuningStore

_ALPHAS = {"p20": 0.2, "p50": 0.5, "p80": 0.8}


@dataclass(frozen=True)
class Timing:
    """One measured config on one problem."""

    problem: Problem
    config: Config
    median_us: float


def timings(store: TuningStore, device: str | None = None) -> list[Timing]:
    """Every successful measurement of the database (of one GPU model's name, when given);
    a row whose config no longer validates is left out."""
    return timings_of(store.trials(), device)


def timings_of(rows: Sequence[dict[str, Any]], device: str | None = None) -> list[Timing]:
    """`timings` of measurement rows already read (`TuningStore.trials`)."""
    found = []
    for row in rows:
        if device is not None and row["device"] != device:
            continue
        median = row["median_us"]
        if row["status"] != "ok" or not isinstance(median, (int, float)) or not median > 0:
            continue
        try:
            data = dict(row["config"])
            family = data.pop("family")
            config = load_space(family).validate(Config.make(family, data))
            problem = Problem(**row["problem"])
        except (KeyError, TypeError, ValueError):
            continue
        if not problem.backward:
            found.append(Timing(problem, config, float(median)))
    return found


def timings_of_recording(data: Mapping[str, Any]) -> list[Timing]:
    """`timings` of a recording of benchmarks/sweep.py (every valid config of a family timed on
    a few problems, torch SDPA's backends beside them): each config that ran, and each SDPA
    backend as a config of the `sdpa` family. A row whose config no longer validates is left
    out (the space changed since the recording)."""
    found = []
    sdpa = load_space(SDPA_FAMILY)
    for shape in data["shapes"]:
        problem = Problem(**shape["problem"])
        if problem.backward:
            continue
        rows = [
            (dict(r["config"]), r.get("median_us"))
            for r in shape["configs"]
            if r.get("status") == "ok"
        ]
        rows += [
            (
                {"family": SDPA_FAMILY, "backend": backend, **problem.space_values()},
                timing.get("median_us"),
            )
            for backend, timing in shape["sdpa"].items()
            if backend in sdpa.params["backend"].values
        ]
        for data_row, median in rows:
            if not isinstance(median, (int, float)) or not median > 0:
                continue
            try:
                family = data_row.pop("family")
                config = load_space(family).validate(Config.make(family, data_row))
            except (KeyError, TypeError, ValueError):
                continue
            found.append(Timing(problem, config, float(median)))
    return found


def timings_of_results(
    entries: Sequence[Mapping[str, Any]], device: str | None = None
) -> list[Timing]:
    """`timings` of result entries (`TuningStore.export`'s, an imported file's): each best
    config at its median, and SDPA's default and flash backends where the entry timed them.
    An entry whose config no longer validates is left out."""
    found = []
    sdpa = load_space(SDPA_FAMILY)
    for entry in entries:
        try:
            if device is not None and entry["device"]["name"] != device:
                continue
            problem = Problem(**entry["problem"])
            if problem.backward:
                continue
            data = dict(entry["config"])
            family = data.pop("family")
            rows = [
                (load_space(family).validate(Config.make(family, data)), entry.get("median_us"))
            ]
            rows += [
                (sdpa.config(**problem.space_values(), backend=backend), entry.get(key))
                for backend, key in (("default", "sdpa_default_us"), ("flash", "sdpa_flash_us"))
            ]
        except (KeyError, TypeError, ValueError):
            continue
        found += [
            Timing(problem, config, float(median))
            for config, median in rows
            if isinstance(median, (int, float)) and median > 0
        ]
    return found


def _schema(data: Sequence[Timing]) -> tuple[list[str], list[str], dict[str, list[str]]]:
    families = sorted({t.config.family for t in data})
    categories: dict[str, set[str]] = {}
    params: set[str] = set()
    for t in data:
        for name, value in t.config.values:
            if name in ("head_dim", "dtype", "causal"):
                continue
            params.add(name)
            if isinstance(value, str):
                categories.setdefault(name, set()).add(value)
    sample = problem_features(data[0].problem)
    names = [*sample, *(f"family={f}" for f in families), *sorted(params)]
    return names, families, {k: sorted(v) for k, v in categories.items()}


def _matrix(
    data: Sequence[Timing], names: list[str], families: list[str], categories: dict[str, list[str]]
) -> list[list[float]]:
    rows = []
    for t in data:
        named = {**problem_features(t.problem), **config_features(t.config, families, categories)}
        rows.append([named.get(n, -1.0) for n in names])
    return rows


def data_digest(data: Sequence[Timing]) -> str:
    """SHA-256 of the timings a model is fitted on (order-free)."""
    lines = sorted(
        json.dumps(
            [t.problem.as_dict(), t.config.to_json(), round(t.median_us, 6)], sort_keys=True
        )
        for t in data
    )
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def fit(
    data: Sequence[Timing],
    device: str,
    *,
    trees: int = 200,
    depth: int = 4,
    learning_rate: float = 0.1,
    seed: int = 0,
) -> dict[str, Any]:
    """The model document of `data` (at least 20 timings)."""
    from sklearn.ensemble import GradientBoostingRegressor

    if len(data) < 20:
        raise ValueError(f"{len(data)} timings are too few to fit a model (20 at least)")
    names, families, categories = _schema(data)
    x = _matrix(data, names, families, categories)
    y = [math.log(t.median_us) for t in data]
    ensembles = {}
    for quantile in QUANTILES:
        model = GradientBoostingRegressor(
            loss="quantile",
            alpha=_ALPHAS[quantile],
            n_estimators=trees,
            max_depth=depth,
            learning_rate=learning_rate,
            random_state=seed,
        )
        model.fit(x, y)
        ensembles[quantile] = _export(model)
    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "device": device,
        "features": names,
        "families": families,
        "categories": categories,
        "kernel_sources": {f: family_source_hash(load_space(f)) for f in families},
        "data_digest": data_digest(data),
        "timings": len(data),
        "problems": len({t.problem for t in data}),
        # Which problems the fit saw: a benchmark of generalization refuses to judge on them.
        "fit_problems": sorted(problem_row(p) for p in {t.problem for t in data}),
        "fitted_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "learner": {
            "library": "scikit-learn GradientBoostingRegressor",
            "loss": "quantile",
            "trees": trees,
            "max_depth": depth,
            "learning_rate": learning_rate,
            "seed": seed,
        },
        "ensembles": ensembles,
    }
    doc["digest"] = digest_of(doc)
    return doc


def _export(model: Any) -> dict[str, Any]:
    trees = []
    for (estimator,) in model.estimators_:
        tree = estimator.tree_
        trees.append(
            {
                "left": tree.children_left.tolist(),
                "right": tree.children_right.tolist(),
                "feature": [max(0, int(f)) for f in tree.feature],
                "threshold": [float(t) for t in tree.threshold],
                "value": [float(v) for v in tree.value[:, 0, 0]],
            }
        )
    return {
        "init": float(model.init_.constant_.ravel()[0]),
        "learning_rate": float(model.learning_rate),
        "trees": trees,
    }


@dataclass(frozen=True)
class HeldOut:
    """How the model predicts problems left out of its fit, for one family."""

    family: str
    timings: int
    problems: int
    median_error: float  # median |predicted / measured - 1|
    p90_error: float
    covered: float  # share of timings inside the predicted p20-p80 range

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def held_out(
    data: Sequence[Timing], device: str, *, folds: int = 5, seed: int = 0, **fit_args: Any
) -> list[HeldOut]:
    """Cross-validation by problem: each fold's problems are predicted by a model fitted on
    the others; the error per family (families with a timing in some left-out problem)."""
    problems = sorted({t.problem for t in data})
    if len(problems) < folds:
        raise ValueError(f"{len(problems)} problems are too few for {folds} folds")
    order = sorted(problems, key=lambda p: hashlib.sha256(f"{seed}:{p}".encode()).hexdigest())
    fold_of = {p: i % folds for i, p in enumerate(order)}
    errors: dict[str, list[float]] = {}
    inside: dict[str, list[bool]] = {}
    seen: dict[str, set[Problem]] = {}
    for fold in range(folds):
        train = [t for t in data if fold_of[t.problem] != fold]
        test = [t for t in data if fold_of[t.problem] == fold]
        if not test or len(train) < 20:
            continue
        model = PerfModel(fit(train, device, seed=seed, **fit_args))
        for t in test:
            guess = model.predict(t.problem, t.config)
            family = t.config.family
            errors.setdefault(family, []).append(abs(guess.median_us / t.median_us - 1))
            inside.setdefault(family, []).append(guess.low_us <= t.median_us <= guess.high_us)
            seen.setdefault(family, set()).add(t.problem)
    return [
        HeldOut(
            f,
            len(errors[f]),
            len(seen[f]),
            statistics.median(errors[f]),
            sorted(errors[f])[int(0.9 * (len(errors[f]) - 1))],
            sum(inside[f]) / len(inside[f]),
        )
        for f in sorted(errors)
    ]
