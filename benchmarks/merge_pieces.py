"""Merge the best configs of tuning pieces run in parallel (one database copy per GPU, see the
sm90piece stage of benchmarks/h200_evidence.sh) back into the session's database.

    python benchmarks/merge_pieces.py sqlite:///.tuning/h200.db \
        /tmp/piece_d128/tune_d128_fp16.db:128:fp16 /tmp/piece_d128/tune_d128_bf16.db:128:bf16

Each piece database started as a copy of the session's, so only the problems of its own head
dim and dtype are taken from it (through `export` / `import --overwrite`, which validates
every entry; the rows are marked imported).
"""

from __future__ import annotations

import argparse
import sys

from autotune.store import TuningStore


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", help="SQLAlchemy URL of the session's database")
    ap.add_argument("pieces", nargs="+", metavar="PATH:HEAD_DIM:DTYPE")
    args = ap.parse_args()
    target = TuningStore(args.target)
    for piece in args.pieces:
        path, head_dim, dtype = piece.rsplit(":", 2)
        data = TuningStore(f"sqlite:///{path}").export()
        data["results"] = [r for r in data["results"] if r["problem"]["head_dim"] == int(head_dim)
                           and r["problem"]["dtype"] == dtype]
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


if __name__ == "__main__":
    raise SystemExit(main())
