"""A performance model of the kernel families and torch SDPA's backends on one GPU model: the
time of a config on a problem, with a range, predicted from features of both.

The model is data: gradient-boosted regression trees (fitted by `autotune.tune.fit_model` with
scikit-learn, which is needed to fit only) written as JSON, one tree ensemble per quantile (20th,
50th, 80th percentile of log time), with the feature names it was fitted on, the kernel-source
hash of each family whose measurements it learnt from, and a SHA-256 digest of all of it. This
module reads and evaluates it in plain Python (no fitting library, no pickle): a document whose
digest does not match is refused, and `stale_families` names the families whose kernels changed
since the fit (their predictions describe kernels that no longer exist).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from .._jsonfile import read_json
from .._paths import shipped_model_files
from .config import Config
from .problem import Problem

FORMAT = "cute-autotune-perf-model"
VERSION = 1
QUANTILES = ("p20", "p50", "p80")
MISSING = -1.0  # a config parameter the family does not have
_MASKS = {"none": 0.0, "is_causal": 1.0, "lower-right": 2.0, "lower-right, Lq > Lk": 3.0}


def _log2(x: float) -> float:
    return math.log2(x) if x > 0 else 0.0


def problem_features(problem: Problem) -> dict[str, float]:
    """What of a problem decides a kernel's time: its sizes (log2), dtype, mask, the mask torch
    would be handed (the path SDPA takes), the cache kind, its work and its bytes."""
    if not problem.causal:
        mask = "none"
    elif problem.seqlen_q == problem.seqlen_k:
        mask = "is_causal"
    else:
        mask = "lower-right" if problem.seqlen_q < problem.seqlen_k else "lower-right, Lq > Lk"
    return {
        "log2_batch": _log2(problem.batch),
        "log2_heads_q": _log2(problem.heads_q),
        "log2_heads_kv": _log2(problem.heads_kv),
        "log2_group": _log2(problem.group_size),
        "log2_seqlen_q": _log2(problem.seqlen_q),
        "log2_seqlen_k": _log2(problem.seqlen_k),
        "head_dim": float(problem.head_dim),
        "bf16": float(problem.dtype == "bf16"),
        "causal": float(problem.causal),
        "sdpa_mask": _MASKS[mask],
        "paged": float(problem.page_size > 0),
        "log2_page": _log2(problem.page_size),
        "seqlens": float(problem.kv_cache == "seqlens"),
        "log2_flops": _log2(problem.flops),
        "log2_bytes": _log2(problem.bytes),
    }


def config_features(
    config: Config, families: list[str], categories: dict[str, list[str]]
) -> dict[str, float]:
    """A config's family (one-hot over `families`) and its tunable values: numbers as they
    are, flags as 0/1, text by its index in `categories` (the values seen in the fit)."""
    values: dict[str, float] = {f"family={f}": float(config.family == f) for f in families}
    for name, value in config.values:
        if name in ("head_dim", "dtype", "causal"):
            continue  # the problem's, counted there
        if isinstance(value, bool):
            values[name] = float(value)
        elif isinstance(value, int):
            values[name] = float(value)
        else:
            known = categories.get(name, [])
            values[name] = float(known.index(value)) if value in known else MISSING
    return values


@dataclass(frozen=True)
class Prediction:
    median_us: float
    low_us: float  # 20th percentile
    high_us: float  # 80th percentile

    def describe(self) -> str:
        return f"{self.median_us:.1f} us (p20-p80 {self.low_us:.1f}-{self.high_us:.1f})"


def problem_row(problem: Problem) -> list[Any]:
    """A problem as a compact JSON row (its fields in declaration order)."""
    return list(problem.as_dict().values())


def digest_of(doc: dict[str, Any]) -> str:
    """SHA-256 of a model document's canonical JSON, its own `digest` field left out."""
    body = {k: v for k, v in doc.items() if k != "digest"}
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


class PerfModel:
    """A fitted model document, checked and ready to predict."""

    def __init__(self, doc: Any) -> None:
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} document")
        if doc.get("version") != VERSION:
            raise ValueError(
                f"a {FORMAT} of version {doc.get('version')!r}; this release "
                f"reads version {VERSION}"
            )
        if doc.get("digest") != digest_of(doc):
            raise ValueError(
                "the performance model's digest does not match its content "
                "(altered or damaged): refused"
            )
        try:
            self.device = str(doc["device"])
            self.features: list[str] = [str(f) for f in doc["features"]]
            self.families: list[str] = [str(f) for f in doc["families"]]
            self.categories: dict[str, list[str]] = {
                str(k): [str(x) for x in v] for k, v in doc["categories"].items()
            }
            self.kernel_sources: dict[str, str] = dict(doc["kernel_sources"])
            self.data_digest = str(doc["data_digest"])
            # The problems the fit saw (absent from documents written before it was kept).
            self.fit_problems = frozenset(Problem(*row) for row in doc.get("fit_problems", []))
            self._ensembles = {
                q: _Ensemble(doc["ensembles"][q], len(self.features)) for q in QUANTILES
            }
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"the performance model is malformed: {exc!r}") from None
        self.doc = doc

    def vector(self, problem: Problem, config: Config) -> list[float]:
        named = {
            **problem_features(problem),
            **config_features(config, self.families, self.categories),
        }
        return [named.get(name, MISSING) for name in self.features]

    def predict(self, problem: Problem, config: Config) -> Prediction:
        x = self.vector(problem, config)
        low, mid, high = (math.exp(self._ensembles[q].predict(x)) for q in QUANTILES)
        return Prediction(mid, min(low, mid), max(high, mid))

    def stale_families(self, current: dict[str, str]) -> list[str]:
        """The families fitted on kernel sources other than `current` (family -> hash)."""
        return sorted(
            f for f, h in self.kernel_sources.items() if f in current and current[f] != h
        )


@functools.cache
def shipped_perf_model(device_name: str) -> PerfModel | None:
    """The model shipped in db/ (`<gpu>.model.json`) fitted on `device_name`, or None (read
    once per process)."""
    for path in shipped_model_files():
        model = PerfModel(read_json(path))
        if model.device == device_name:
            return model
    return None


class _Ensemble:
    """Trees of one quantile: init + learning_rate * the sum of the leaves reached."""

    def __init__(self, doc: dict[str, Any], width: int) -> None:
        self.init = float(doc["init"])
        self.rate = float(doc["learning_rate"])
        self.trees = []
        for tree in doc["trees"]:
            left, right = list(map(int, tree["left"])), list(map(int, tree["right"]))
            feature = list(map(int, tree["feature"]))
            threshold = list(map(float, tree["threshold"]))
            value = list(map(float, tree["value"]))
            nodes = len(value)
            if not (len(left) == len(right) == len(feature) == len(threshold) == nodes):
                raise ValueError("a tree's arrays differ in length")
            for i in range(nodes):
                if left[i] != -1 and not (
                    i < left[i] < nodes and i < right[i] < nodes and 0 <= feature[i] < width
                ):
                    raise ValueError(f"tree node {i} points outside its tree")
            self.trees.append((left, right, feature, threshold, value))

    def predict(self, x: list[float]) -> float:
        total = 0.0
        for left, right, feature, threshold, value in self.trees:
            node = 0
            while left[node] != -1:
                node = left[node] if x[feature[node]] <= threshold[node] else right[node]
            total += value[node]
        return self.init + self.rate * total
