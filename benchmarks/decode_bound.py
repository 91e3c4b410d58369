"""What the timing rule lets any decode kernel reach on the problems short of issue 15's targets.

Each problem's K and V lie in one buffer; in one plain alternating check (the decode bench's:
fixed order, L2 flushed by writing 512 MiB before each call, median of 41) this times

- a one-element fill: the timing's own floor, which every call pays;
- a read of the problem's K and V (a sum over the buffer): streaming the bytes any kernel must
  read, with nothing else to do;
- a copy of the same buffer (reads the bytes, writes as many);
- `autotune.attention` (the tuned kernel `db/` holds) and SDPA's default.

The roofline is the decode bench's: min(680 TFLOP/s, FLOP per byte x the bandwidth of a 4 GiB
device-to-device copy measured in the same run). `best_fraction` is the roofline over the
fastest pure stream's time: a kernel whose attention cost nothing beside its reads could reach
no higher fraction under this timing.

    python benchmarks/decode_bound.py --json OUT.json [--db sqlite:///...]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from alternating_check import _sdpa  # noqa: E402
from decode_bench import alternating, copy_tb_per_s, roofline_us, write_probe  # noqa: E402

import autotune  # noqa: E402
from autotune.model import Problem  # noqa: E402

# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, causal): the rows below a target in the
# 2026-12-03 bench, then two that meet theirs (the same kind of row at a larger batch or cache).
PROBLEMS = [
    (1, 32, 8, 1, 8192, False),
    (1, 32, 8, 16, 8192, True),
    (1, 64, 8, 16, 8192, True),
    (1, 32, 8, 16, 32768, True),
    (1, 64, 8, 16, 32768, True),
    (1, 32, 8, 8, 32768, True),
    (8, 64, 8, 16, 8192, True),
    (8, 32, 8, 16, 8192, True),
    (1, 32, 8, 16, 131072, True),
]


def calls_for(problem: Problem) -> dict[str, Any]:
    b, hq, hkv, lq, lk, d = (problem.batch, problem.heads_q, problem.heads_kv,
                             problem.seqlen_q, problem.seqlen_k, problem.head_dim)
    q = torch.randn(b, hq, lq, d, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(2, b, hkv, lk, d, device="cuda", dtype=torch.bfloat16)
    k, v = kv[0], kv[1]
    copy_to = torch.empty_like(kv)
    return {
        "read": lambda: kv.sum(dtype=torch.float32),
        "copy": lambda: copy_to.copy_(kv),
        "attention": lambda: autotune.attention(q, k, v, causal=problem.causal),
        "sdpa": _sdpa(q, k, v, problem.causal, None),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--db", help="the tuning database attention() reads (default: db/)")
    args = parser.parse_args()
    if args.db:
        autotune.configure(db=args.db)
    copy_bw = copy_tb_per_s()
    fill = torch.zeros(1, device="cuda")
    rows: list[dict[str, Any]] = []
    for b, hq, hkv, lq, lk, causal in PROBLEMS:
        problem = Problem(b, hq, hkv, lq, lk, 128, "bf16", causal)
        calls = {"fill": fill.zero_, **calls_for(problem)}
        us = alternating(calls)
        roofline = roofline_us(problem, copy_bw)
        stream_us = min(us["read"], us["copy"])
        rows.append({
            "shape": problem.describe(), "problem": problem.as_dict(),
            "us": {name: round(t, 2) for name, t in us.items()},
            "roofline_us": round(roofline, 2),
            "fraction": {name: round(roofline / us[name], 3)
                         for name in ("read", "copy", "attention", "sdpa")},
            "best_fraction": round(roofline / stream_us, 3),
            "read_tb_s": round(problem.bytes / us["read"] / 1e6, 3),
        })
        torch.cuda.empty_cache()
    print(f"copy {copy_bw:.2f} TB/s; fractions of the roofline (us in brackets)")
    print(f"{'problem':<40} {'roofline':>8} {'fill':>6} {'read':>13} {'copy':>13} "
          f"{'attention':>13} {'sdpa':>13}")
    for r in rows:
        u, f = r["us"], r["fraction"]
        cells = " ".join(f"{f[n]:5.3f} ({u[n]:6.1f})" for n in ("read", "copy", "attention",
                                                                 "sdpa"))
        print(f"{r['shape']:<40} {r['roofline_us']:8.1f} {u['fill']:6.2f} {cells}")
    write_probe(args.json, rows, copy_tb_s=round(copy_bw, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
