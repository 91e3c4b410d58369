"""Merge the pieces of a run spread over several device calls (a call ends at 10 minutes):

python benchmarks/merge.py checks OUT.json CHECK.json... --command "..."
    `cute-autotune check --json` reports into one evidence file with totals
python benchmarks/merge.py recordings OUT.json.gz PIECE.json.gz...
    recordings of one family by several sweep.py runs into the one file `--replay` takes
    (same GPU, family and kernel sources; different problems; each problem keeps the
    timing settings it was recorded with)
python benchmarks/merge.py pieces TARGET_URL PIECE.db:HEAD_DIM:DTYPE...
    the best configs of tuning pieces run in parallel (one database copy per GPU) back
    into the session's database: only the problems of each piece's own head dim and dtype,
    through `export` / `import --overwrite` (every entry validated, rows marked imported)
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

from autotune.store import TuningStore


def _parts(report: dict[str, Any]) -> list[dict[str, Any]]:
    """A check report is one part; an already merged file brings its parts along."""
    if "parts" in report:
        return list(report["parts"])
    return [
        {
            "command": report["command"],
            "seed": report["seed"],
            "valid": report["valid"],
            "compiled": report["compiled"],
            "passed": report["passed"],
        }
    ]


def merge_checks(output: str, paths: list[str], command: str) -> int:
    reports = [json.loads(Path(p).read_text()) for p in sorted(paths)]
    merged = {
        "gpu": reports[0]["gpu"],
        "arch": reports[0]["arch"],
        "nvcc": reports[0]["nvcc"],
        "cutlass": reports[0]["cutlass"],
        "command": command,
        "parts": [part for r in reports for part in _parts(r)],
    }
    for key in ("considered", "valid", "compiled", "passed"):
        merged[key] = sum(r[key] for r in reports)
    for key in ("spilling", "failures", "results"):
        merged[key] = [item for r in reports for item in r[key]]
    Path(output).write_text(json.dumps(merged, indent=1))
    print(
        f"{len(reports)} reports: {merged['valid']} valid, {merged['compiled']} compiled, "
        f"{merged['passed']} passed, {len(merged['spilling'])} spill, "
        f"{len(merged['failures'])} failures"
    )
    return 0


SAME = ("gpu", "device", "torch", "nvcc", "family", "source_hash")


def read_recording(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    data: dict[str, Any] = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    return data


def merge_recording(pieces: list[dict[str, Any]]) -> dict[str, Any]:
    first = pieces[0]
    for piece in pieces[1:]:
        differ = [k for k in SAME if piece.get(k) != first.get(k)]
        if differ:
            raise ValueError(f"pieces differ in {', '.join(differ)}")
    shapes: list[dict[str, Any]] = []
    for piece in pieces:
        timing = {k: piece.get(k) for k in ("rounds", "round_ms", "warmup_ms")}
        for shape in piece["shapes"]:
            if any(s["problem"] == shape["problem"] for s in shapes):
                raise ValueError(f"two pieces record {shape['problem']}")
            shapes.append({**shape, "timing": shape.get("timing", timing)})
    merged = {k: first[k] for k in SAME if k in first}
    merged["commands"] = [c for p in pieces for c in p.get("commands", [p.get("command")])]
    merged["shapes"] = shapes
    return merged


def merge_recordings(output: str, paths: list[Path]) -> int:
    merged = merge_recording([read_recording(p) for p in paths])
    text = json.dumps(merged, separators=(",", ":")).encode()
    Path(output).write_bytes(gzip.compress(text, mtime=0) if output.endswith(".gz") else text)
    print(
        f"{output}: {merged['family']}, {len(merged['shapes'])} problems, "
        f"{sum(len(s['configs']) for s in merged['shapes'])} rows"
    )
    return 0


def merge_pieces(target_url: str, pieces: list[str]) -> int:
    target = TuningStore(target_url)
    for piece in pieces:
        path, head_dim, dtype = piece.rsplit(":", 2)
        data = TuningStore(f"sqlite:///{path}").export()
        data["results"] = [
            r
            for r in data["results"]
            if r["problem"]["head_dim"] == int(head_dim) and r["problem"]["dtype"] == dtype
        ]
        if not data["results"]:
            print(f"{piece}: no best config of D={head_dim} {dtype}", file=sys.stderr)
            return 1
        counts = target.import_results(data, overwrite=True)
        families: dict[str, int] = {}
        for r in data["results"]:
            families[r["family"]] = families.get(r["family"], 0) + 1
        by_family = ", ".join(f"{f} {n}" for f, n in sorted(families.items()))
        print(f"{piece}: {counts['imported']} imported ({by_family})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    kinds = parser.add_subparsers(dest="kind", required=True)
    checks = kinds.add_parser("checks", help="cute-autotune check reports")
    checks.add_argument("output")
    checks.add_argument("reports", nargs="+")
    checks.add_argument("--command", required=True, help="what produced the reports")
    recordings = kinds.add_parser("recordings", help="sweep.py recordings of one family")
    recordings.add_argument("output")
    recordings.add_argument("pieces", nargs="+", type=Path)
    pieces = kinds.add_parser("pieces", help="tuning databases of parallel pieces")
    pieces.add_argument("target", help="SQLAlchemy URL of the session's database")
    pieces.add_argument("pieces", nargs="+", metavar="PATH:HEAD_DIM:DTYPE")
    args = parser.parse_args(argv)
    if args.kind == "checks":
        return merge_checks(args.output, args.reports, args.command)
    if args.kind == "recordings":
        return merge_recordings(args.output, args.pieces)
    return merge_pieces(args.target, args.pieces)


if __name__ == "__main__":
    sys.exit(main())
