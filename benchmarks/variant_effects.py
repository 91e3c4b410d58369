"""Where the time goes, from a tuning database: per problem, the best search timing with one
switch or tile edge fixed, relative to the best of all (1.00 = costs nothing; '-' = the search
tried no such config). The searched configs are TPE's choice, not controlled pairs, so a ratio
bounds the effect from below rather than measuring it.

    python benchmarks/variant_effects.py /tmp/piece_d128/tune_d128_fp16.db:128:fp16 ...
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from autotune.model import load_shape_set
from autotune.store import TuningStore

Pick = Callable[[dict[str, Any]], bool]
COLUMNS: list[tuple[str, Pick]] = [
    ("persistent off", lambda c: not c["persistent"]),
    ("ping-pong off", lambda c: not c["pingpong"]),
    ("overlap off", lambda c: not c["overlap"]),
    ("bm64", lambda c: c["block_m"] == 64),
    ("bm192", lambda c: c["block_m"] == 192),
    ("bn64", lambda c: c["block_n"] == 64),
    ("bn176", lambda c: c["block_n"] == 176),
]


def main(pieces: list[str]) -> int:
    print(f"{'problem':32s} {'trials':>6s} {'TFLOP/s':>7s}  "
          + "  ".join(f"{n:>14s}" for n, _ in COLUMNS))
    for piece in pieces:
        path, head_dim, dtype = piece.rsplit(":", 2)
        store = TuningStore(f"sqlite:///{path}")
        for problem in load_shape_set("llm-prefill"):
            if problem.head_dim != int(head_dim) or problem.dtype != dtype:
                continue
            rows = [t for t in store.trials(problem=problem) if t["median_us"]
                    and t["config"]["family"] == "sm90" and t["phase"] == "search"]
            if not rows:
                continue
            best = min(t["median_us"] for t in rows)

            def ratio(pick: Pick, rows: list[dict[str, Any]] = rows, best: float = best) -> str:
                times = [t["median_us"] for t in rows if pick(t["config"])]
                return f"{best / min(times):14.2f}" if times else f"{'-':>14s}"

            print(f"{problem.describe():32s} {len(rows):6d} {problem.tflops(best):7.1f}  "
                  + "  ".join(ratio(pick) for _, pick in COLUMNS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
