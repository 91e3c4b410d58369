"""Per-call host time of `autotune.attention` (lookup + launch) against torch SDPA, on tiny shapes
where the GPU work (a few microseconds) is shorter than the host's: the measured wall time per
call is then the host's. Both run the same inputs, alternately, several rounds; medians.

    python benchmarks/host_overhead.py --json benchmarks/results/host_overhead_h200.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import autotune

SHAPES = [(1, 1, 16, 64), (1, 4, 32, 128), (2, 8, 64, 64)]


def per_call_us(fn, calls: int) -> float:  # type: ignore[no-untyped-def]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rows = []
    for b, h, length, d in SHAPES:
        q, k, v = (torch.randn(b, h, length, d, device="cuda", dtype=torch.float16)
                   for _ in range(3))
        def ours(q=q, k=k, v=v):  # type: ignore[no-untyped-def]
            return autotune.attention(q, k, v, causal=True, strict=True)

        def sdpa(q=q, k=k, v=v):  # type: ignore[no-untyped-def]
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        decision = autotune.explain(q, k, v, causal=True)
        for fn in (ours, sdpa):
            per_call_us(fn, 200)  # warm-up: decision, module load, allocator
        samples: dict[str, list[float]] = {"ours": [], "sdpa": []}
        for _ in range(args.rounds):
            samples["ours"].append(per_call_us(ours, args.calls))
            samples["sdpa"].append(per_call_us(sdpa, args.calls))
        family = decision.config.family if decision.config else None
        row = {"shape": f"B{b} H{h} L{length} D{d} fp16 causal", "path": decision.path,
               "family": family,
               "ours_us": round(statistics.median(samples["ours"]), 2),
               "sdpa_us": round(statistics.median(samples["sdpa"]), 2),
               "ours_rounds_us": [round(x, 2) for x in samples["ours"]],
               "sdpa_rounds_us": [round(x, 2) for x in samples["sdpa"]]}
        rows.append(row)
        print(f"{row['shape']}: ours {row['ours_us']} us/call ({decision.path}, {family}), "
              f"SDPA {row['sdpa_us']} us/call", flush=True)
    Path(args.json).write_text(json.dumps({"gpu": torch.cuda.get_device_name(),
                                           "torch": torch.__version__,
                                           "command": " ".join(["python", *sys.argv]),
                                           "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
