"""Merge recordings of one family made by several sweep.py runs (pieces of one session: a call
to the GPU host ends at 10 minutes) into the one file `--replay` takes.

    python benchmarks/merge_recordings.py OUT.json.gz PIECE.json.gz [PIECE.json.gz ...]

The pieces must be of the same GPU, family and kernel sources, and hold different problems.
Each problem keeps the timing settings it was recorded with (`timing`).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

SAME = ("gpu", "device", "torch", "nvcc", "family", "source_hash")


def read(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    data: dict[str, Any] = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    return data


def merge(pieces: list[dict[str, Any]]) -> dict[str, Any]:
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("pieces", nargs="+", type=Path)
    args = parser.parse_args()
    merged = merge([read(p) for p in args.pieces])
    text = json.dumps(merged, separators=(",", ":")).encode()
    Path(args.output).write_bytes(gzip.compress(text, mtime=0) if args.output.endswith(".gz")
                                  else text)
    print(f"{args.output}: {merged['family']}, {len(merged['shapes'])} problems, "
          f"{sum(len(s['configs']) for s in merged['shapes'])} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
