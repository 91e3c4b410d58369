"""Export and import of best configs (`cute-autotune export` / `import`, the shipped results)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from .best_rows import BestRows
from .exchange import EXPORT_FORMAT, EXPORT_VERSION, ImportEntry, parse_export
from .models import (
    BestConfig,
)
from .records import BestRecord, DeviceInfo
from .schema import (
    head_revision,
)


class ImportRows(BestRows):
    """Export of the best configs and their import, validated entry by entry."""

    # -- export / import --------------------------------------------------------------------

    def export(self, device: DeviceInfo | str | None = None) -> dict[str, Any]:
        return {
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "schema": head_revision(),
            "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "results": [
                {
                    "device": r.device.as_dict(),
                    "problem": r.problem.as_dict(),
                    "family": r.config.family,
                    "config": r.config.as_dict(),
                    "median_us": r.median_us,
                    "tflops": r.tflops,
                    "sdpa_default_us": r.sdpa_default_us,
                    "sdpa_flash_us": r.sdpa_flash_us,
                    "trials": r.trials,
                    "study": r.study,
                    "source": r.source,
                    "p20_us": r.p20_us,
                    "p80_us": r.p80_us,
                    "decision": r.decision,
                    "runner_up_us": r.runner_up_us,
                    "torch_version": r.torch_version,
                    "cudnn_version": r.cudnn_version,
                    "regime": r.regime,
                }
                for r in self.list_best(device)
            ],
        }

    def import_results(
        self, data: Any, *, overwrite: bool = False, refresh_imported: bool = False
    ) -> dict[str, int]:
        """Import an export in one transaction: every entry is validated first, and a bad
        entry (or a failure while writing) imports nothing.

        An existing best config is kept unless `overwrite`; with `refresh_imported`, one that
        was itself imported (not tuned here) is replaced when the entry differs, which is how
        newer shipped results reach a database seeded by older ones. Entries equal to what is
        stored write nothing; an entry repeating an earlier one of the file is counted as a
        duplicate (one that repeats it with another result refuses the file)."""
        entries = parse_export(data)
        counts = {"imported": 0, "kept_existing": 0, "duplicates": 0}
        with self._transaction() as s, s.no_autoflush:
            rows = self._best_rows(s, None)
            stored = {
                (r.device.name, r.device.compute_capability, r.device.sm_count, r.problem): r
                for r in self._records_of(rows)
            }
            chosen: dict[Any, ImportEntry] = {}
            for entry in entries:
                if entry.key in chosen:
                    counts["duplicates"] += 1
                elif self._replaces(stored.get(entry.key), entry, overwrite, refresh_imported):
                    chosen[entry.key] = entry
                else:
                    counts["kept_existing"] += 1
            # The rows the entries refer to, looked up and created in bulk (one flush), not
            # one round trip per entry: a shared results file can hold 100k+ entries.
            devices = {d: self._device(s, d).id for d in {e.device for e in chosen.values()}}
            problems = self._problem_ids(s, {e.problem for e in chosen.values()})
            configs = self._config_ids(s, {e.result.config for e in chosen.values()})
            existing = {(row.device_id, row.problem_id): row for row in rows}
            for entry in chosen.values():
                ids = (devices[entry.device], problems[entry.problem])
                self._put_best(
                    s,
                    *ids,
                    configs[entry.result.config],
                    entry.problem,
                    entry.result,
                    measurement_id=None,
                    study=entry.study,
                    trials=entry.trials,
                    sdpa_default_us=entry.sdpa_default_us,
                    sdpa_flash_us=entry.sdpa_flash_us,
                    source="imported",
                    decision=entry.decision,
                    runner_up_us=entry.runner_up_us,
                    row=existing.get(ids) or BestConfig(device_id=ids[0], problem_id=ids[1]),
                )
                counts["imported"] += 1
        return counts

    @staticmethod
    def _replaces(
        existing: BestRecord | None, entry: ImportEntry, overwrite: bool, refresh_imported: bool
    ) -> bool:
        if existing is None or overwrite:
            return True
        return (
            refresh_imported
            and existing.source == "imported"
            and (existing.config, existing.median_us)
            != (entry.result.config, entry.result.median_us)
        )
