"""Three measurements of the same speed-up over torch SDPA's default, per problem: the one the
database stored with the best config (the tuner's re-ranking), `cute-autotune bench`'s
(autotune.cli.bench.bench_problem, the same code) and the plain alternating-call check
(benchmarks/alternating_check.py). Writes the bench rows with the check beside them
(--bench-json) and the agreement of the three (--agreement-json).

    python benchmarks/timing_agreement.py --db URL --shapes llm-prefill llm-decode \
        --bench-json bench_no_regret_h200.json --agreement-json timing_agreement_h200.json

`--from-bench FILE ... --agreement-json OUT` writes the agreement again from bench files this
script wrote (they hold every figure of it: the stored speed-up, bench's and the check's),
without a GPU; `--merge-bench OUT` also merges those bench files into one.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from alternating_check import alternating  # noqa: E402


def agreement_entry(name: str, row: dict[str, Any]) -> dict[str, Any]:
    """One problem's three speed-ups over SDPA's default and their ratios."""
    check = row["alternating"]
    stored = row.get("stored_speedup_vs_sdpa_default")
    entry = {
        "set": name,
        "shape": row["shape"],
        "dispatched": row["family"],
        "sdpa_backend": row["sdpa_backend"],
        "stored": stored,
        "bench": row["speedup_vs_sdpa_default"],
        "alternating": check["speedup_vs_sdpa_default"],
        "bench_regret": row["regret"],
        "alternating_regret": check["regret"],
    }
    entry["stored_vs_bench"] = stored / entry["bench"] if stored else None
    entry["bench_vs_alternating"] = entry["bench"] / entry["alternating"]
    return entry


def spread(entries: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [e[key] for e in entries if e[key] is not None]
    return (
        {
            "min": min(values),
            "max": max(values),
            "worst_abs_pct": 100 * max(abs(v - 1) for v in values),
        }
        if values
        else {}
    )


def agreement_document(device: Any, entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "device": device,
        "rows": entries,
        "stored_vs_bench": spread(entries, "stored_vs_bench"),
        "bench_vs_alternating": spread(entries, "bench_vs_alternating"),
    }


def from_bench(files: list[str], agreement_json: str, merged: str | None) -> int:
    documents = [json.loads(Path(f).read_text()) for f in files]
    sets = {name: summary for d in documents for name, summary in d["sets"].items()}
    entries = [
        agreement_entry(name, row) for name, summary in sets.items() for row in summary["rows"]
    ]
    device = documents[0]["device"]
    Path(agreement_json).write_text(json.dumps(agreement_document(device, entries), indent=1))
    if merged:
        Path(merged).write_text(json.dumps({"device": device, "sets": sets}, indent=1))
    print("stored/bench:", spread(entries, "stored_vs_bench"))
    print("bench/alternating:", spread(entries, "bench_vs_alternating"))
    return 0


def main() -> int:
    import autotune
    from autotune.cli import bench_problem, geomean, summarize
    from autotune.model import load_shape_set
    from autotune.runtime import device_info
    from autotune.store import TuningStore

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db")
    parser.add_argument("--shapes", nargs="+")
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--bench-json")
    parser.add_argument("--agreement-json", required=True)
    parser.add_argument("--from-bench", nargs="+")
    parser.add_argument("--merge-bench")
    args = parser.parse_args()
    if args.from_bench:
        return from_bench(args.from_bench, args.agreement_json, args.merge_bench)
    if not (args.db and args.shapes and args.bench_json):
        parser.error("--db, --shapes and --bench-json are needed to measure")
    autotune.configure(db=args.db)
    store = TuningStore(args.db)
    device = device_info(0)
    sets: dict[str, Any] = {}
    agreement = []
    for name in args.shapes:
        rows = []
        for problem in load_shape_set(name):
            row = bench_problem(problem)
            check = alternating(problem, calls=args.calls)
            row["alternating"] = check
            stored = store.best(device, problem)
            row["stored_speedup_vs_sdpa_default"] = stored.speedup_vs_default if stored else None
            entry = agreement_entry(name, row)
            stored_speedup = entry["stored"]
            agreement.append(entry)
            rows.append(row)
            print(
                f"{row['shape']:<40} {str(row['family']):<5} stored "
                f"{stored_speedup or math.nan:.3f}x bench {entry['bench']:.3f}x alternating "
                f"{entry['alternating']:.3f}x regret {row['regret']:.3f}/"
                f"{check['regret']:.3f}",
                flush=True,
            )
        summary = summarize(rows)
        summary["alternating_geomean_vs_sdpa_default"] = geomean(
            [r["alternating"]["speedup_vs_sdpa_default"] for r in rows]
        )
        summary["alternating_worst_vs_sdpa_default"] = min(
            r["alternating"]["speedup_vs_sdpa_default"] for r in rows
        )
        summary["alternating_worst_regret"] = max(r["alternating"]["regret"] for r in rows)
        sets[name] = summary
    Path(args.bench_json).write_text(
        json.dumps({"device": device.as_dict(), "sets": sets}, indent=1)
    )

    Path(args.agreement_json).write_text(
        json.dumps(agreement_document(device.as_dict(), agreement), indent=1)
    )
    for name, summary in sets.items():
        print(
            f"{name}: bench geomean {summary['geomean_vs_sdpa_default']:.3f}x worst "
            f"{summary['worst_vs_sdpa_default']:.3f}x regret {summary['worst_regret']:.3f}; "
            f"alternating geomean {summary['alternating_geomean_vs_sdpa_default']:.3f}x "
            f"worst {summary['alternating_worst_vs_sdpa_default']:.3f}x regret "
            f"{summary['alternating_worst_regret']:.3f}"
        )
    print("stored/bench:", spread(agreement, "stored_vs_bench"))
    print("bench/alternating:", spread(agreement, "bench_vs_alternating"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
