"""The performance models kept in the tuning database (schema 0.6.0): one per GPU model's name,
fitted over the database's own measurements by `tune`, `import` and `model fit --store`
(autotune/tune/refit.py), read by `explain()` and `tune --quick` in preference to the model
shipped in db/ where it learnt from at least as many timings.

A model is stored as the JSON document `autotune.model.perf_model` reads (never a pickle),
beside its digest and the digest of the timings it was fitted on: a refit over unchanged data is
skipped, and a row whose text no longer matches its digest, is not JSON, or names another GPU
is refused when read (BrokenRow, which says how to refit), never evaluated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select

from ..model.perf_model import PerfModel
from .exchange import BrokenRow
from .models import PerfModelRow, utcnow
from .repo import TuningStore
from .row_helpers import _utc
from .schema import describe

FITTED_BY = ("tune", "import", "model fit")


@dataclass(frozen=True)
class StoredModel:
    """What a database says of a model it holds, without reading the document."""

    device_name: str
    digest: str
    data_digest: str
    timings: int
    fitted_by: str
    fitted_at: datetime | None


class PerfModels:
    """The performance models in a tuning database (`store`)."""

    def __init__(self, store: TuningStore) -> None:
        self.store = store

    def save(self, doc: dict[str, Any], fitted_by: str) -> StoredModel:
        """Keep `doc` (a fitted model document) as its GPU model's model, replacing the one
        there. The document is checked first (PerfModel): a damaged one is refused."""
        if fitted_by not in FITTED_BY:
            raise ValueError(f"fitted_by must be one of {FITTED_BY}, got {fitted_by!r}")
        model = PerfModel(doc)
        row = PerfModelRow(
            device_name=model.device,
            digest=str(doc["digest"]),
            data_digest=model.data_digest,
            timings=int(doc.get("timings", 0)),
            fitted_by=fitted_by,
            fitted_at=utcnow(),
            doc_json=json.dumps(doc, separators=(",", ":")),
        )
        with self.store._transaction() as s:
            s.execute(delete(PerfModelRow).where(PerfModelRow.device_name == model.device))
            s.add(row)
        return _stored(row)

    def describe(self, device_name: str) -> StoredModel | None:
        """The stored model of `device_name` as the row describes it (its document unread)."""
        with self.store._reading() as s:
            row = s.scalars(
                select(PerfModelRow).where(PerfModelRow.device_name == device_name)
            ).first()
            return None if row is None else _stored(row)

    def all(self) -> list[StoredModel]:
        with self.store._reading() as s:
            return [
                _stored(row)
                for row in s.scalars(select(PerfModelRow).order_by(PerfModelRow.device_name))
            ]

    def load(self, device_name: str) -> PerfModel | None:
        """The stored model of `device_name`, checked; None when there is none. BrokenRow
        for a row that does not hold the model it claims to."""
        with self.store._reading() as s:
            row = s.scalars(
                select(PerfModelRow).where(PerfModelRow.device_name == device_name)
            ).first()
            if row is None:
                return None
            text, digest = row.doc_json, row.digest
        where = f"the performance model stored for {device_name} in {describe(self.store.url)}"
        fix = "refit it: cute-autotune model fit --store"
        try:
            model = PerfModel(json.loads(text))
        except (TypeError, ValueError) as exc:
            raise BrokenRow(f"{where} is refused ({exc}); {fix}") from None
        if model.device != device_name or model.doc.get("digest") != digest:
            raise BrokenRow(
                f"{where} is refused (its document is of {model.device!r} with "
                f"another digest than the row's); {fix}"
            )
        return model


def _stored(row: PerfModelRow) -> StoredModel:
    return StoredModel(
        row.device_name,
        row.digest,
        row.data_digest,
        row.timings,
        row.fitted_by,
        None if row.fitted_at is None else _utc(row.fitted_at),
    )


def model_for(store: TuningStore | None, device_name: str) -> tuple[PerfModel | None, str]:
    """The model to predict with on `device_name` and where it comes from: the database's,
    where it learnt from at least as many timings as the one shipped in db/ (or none ships),
    else the shipped one. A stored model that is refused (BrokenRow) is passed over with a
    warning that says so."""
    import warnings

    from ..model.perf_model import shipped_perf_model

    shipped = shipped_perf_model(device_name)
    stored = None
    if store is not None:
        try:
            stored = PerfModels(store).load(device_name)
        except BrokenRow as exc:
            warnings.warn(str(exc), stacklevel=2)
    if stored is not None and (shipped is None or _timings(stored) >= _timings(shipped)):
        return stored, f"fitted in {describe(store.url)}" if store is not None else "stored"
    if shipped is not None:
        return shipped, "shipped in db/"
    return None, "none"


def _timings(model: PerfModel) -> int:
    value = model.doc.get("timings", 0)
    return value if isinstance(value, int) else 0
