"""Merge several `cute-autotune check --json` reports into one evidence file with totals.

    python benchmarks/merge_checks.py OUT.json CHECK.json [CHECK.json ...] --command "..."
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _parts(report: dict[str, Any]) -> list[dict[str, Any]]:
    """A check report is one part; an already merged file brings its parts along."""
    if "parts" in report:
        return list(report["parts"])
    return [{"command": report["command"], "seed": report["seed"], "valid": report["valid"],
             "compiled": report["compiled"], "passed": report["passed"]}]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("reports", nargs="+")
    parser.add_argument("--command", required=True, help="what produced the reports")
    args = parser.parse_args()
    reports = [json.loads(Path(p).read_text()) for p in sorted(args.reports)]
    merged = {
        "gpu": reports[0]["gpu"], "arch": reports[0]["arch"], "nvcc": reports[0]["nvcc"],
        "cutlass": reports[0]["cutlass"], "command": args.command,
        "parts": [part for r in reports for part in _parts(r)],
    }
    for key in ("considered", "valid", "compiled", "passed"):
        merged[key] = sum(r[key] for r in reports)
    for key in ("spilling", "failures", "results"):
        merged[key] = [item for r in reports for item in r[key]]
    Path(args.output).write_text(json.dumps(merged, indent=1))
    print(f"{len(reports)} reports: {merged['valid']} valid, {merged['compiled']} compiled, "
          f"{merged['passed']} passed, {len(merged['spilling'])} spill, "
          f"{len(merged['failures'])} failures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
