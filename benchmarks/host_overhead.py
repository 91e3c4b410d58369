"""Per-call host time of `autotune.attention` (lookup + launch) against torch SDPA, on tiny shapes
where the GPU work (a few microseconds) is shorter than the host's: the measured wall time per
call is then the host's. Both run the same inputs, alternately, several rounds; medians.

    python benchmarks/host_overhead.py --json benchmarks/results/host_overhead_h200.json

`--decode`: the decode calls instead, B1 H32/8 Lq1 D128 bf16 against 512 keys (the GPU's part
a few microseconds) and 8192 (the decode bench's shape): torch SDPA, `attention` and
`attention_with_kvcache` on a contiguous cache, with per-sequence lengths, paged (pages of 16)
and appending a token. Per call: `issue_us`, the host's time (no synchronisation inside the
loop), and `step_us`, one call and a synchronisation, what an eager decode step waits for.
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


def step_us(fn, calls: int) -> float:  # type: ignore[no-untyped-def]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def decode_calls(seqlen_k: int) -> dict[str, object]:
    """The decode calls of one cache length, B1 H32/8 Lq1 D128 bf16, every one on its own
    inputs (a cache of `seqlen_k` rows per sequence, full)."""
    batch, heads_q, heads_kv, dim, page = 1, 32, 8, 128, 16
    bf16 = torch.bfloat16
    q = torch.randn(batch, 1, heads_q, dim, device="cuda", dtype=bf16)  # [B, L, H, D]
    k, v = (
        torch.randn(batch, seqlen_k, heads_kv, dim, device="cuda", dtype=bf16) for _ in range(2)
    )
    q_sdpa, k_sdpa, v_sdpa = (t.transpose(1, 2) for t in (q, k, v))
    lengths = torch.full((batch,), seqlen_k - 1, dtype=torch.int32, device="cuda")
    pages = seqlen_k // page
    k_paged, v_paged = (t.reshape(batch * pages, page, heads_kv, dim) for t in (k, v))
    table = torch.randperm(batch * pages, device="cuda").to(torch.int32).reshape(batch, pages)
    k_new, v_new = (
        torch.randn(batch, 1, heads_kv, dim, device="cuda", dtype=bf16) for _ in range(2)
    )
    return {
        "sdpa": lambda: F.scaled_dot_product_attention(q_sdpa, k_sdpa, v_sdpa, enable_gqa=True),
        "attention": lambda: autotune.attention(q, k, v, layout="blhd"),
        "kvcache": lambda: autotune.attention_with_kvcache(q, k, v),
        "kvcache seqlens": lambda: autotune.attention_with_kvcache(q, k, v, cache_seqlens=lengths),
        "kvcache paged16": lambda: autotune.attention_with_kvcache(
            q, k_paged, v_paged, block_table=table, cache_seqlens=lengths
        ),
        "kvcache append": lambda: autotune.attention_with_kvcache(
            q, k, v, k_new=k_new, v_new=v_new, cache_seqlens=lengths
        ),
    }


def decode_rows(calls: int, rounds: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for seqlen_k in (512, 8192):
        fns = decode_calls(seqlen_k)
        for fn in fns.values():
            per_call_us(fn, 50)  # warm-up: decision, module load, plan, allocator
        issue: dict[str, list[float]] = {name: [] for name in fns}
        step: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(rounds):  # the calls alternate within each round
            for name, fn in fns.items():
                issue[name].append(per_call_us(fn, calls))
                step[name].append(step_us(fn, calls // 4))
        for name in fns:
            row = {
                "shape": f"B1 H32/8 Lq1 Lk{seqlen_k} D128 bf16",
                "call": name,
                "issue_us": round(statistics.median(issue[name]), 2),
                "step_us": round(statistics.median(step[name]), 2),
                "issue_rounds_us": [round(x, 2) for x in issue[name]],
            }
            rows.append(row)
            print(
                f"{row['shape']:28s} {name:16s} issue {row['issue_us']:7.2f} us  "
                f"step {row['step_us']:7.2f} us",
                flush=True,
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--decode", action="store_true", help="the decode calls (attention_with_kvcache) instead"
    )
    args = parser.parse_args()
    if args.decode:
        import cProfile
        import pstats

        profile = cProfile.Profile()  # where a repeated contiguous-cache call's host time goes
        kvcache = decode_calls(512)["kvcache"]
        per_call_us(kvcache, 50)  # the first call (decision, plan) stays out of the profile
        profile.runcall(lambda: [kvcache() for _ in range(500)])  # type: ignore[operator]
        pstats.Stats(profile).sort_stats("tottime").print_stats(14)
        result = {
            "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "command": " ".join(["python", *sys.argv]),
            "rows": decode_rows(args.calls, args.rounds),
        }
        Path(args.json).write_text(json.dumps(result, indent=1))
        return 0
    rows = []
    for b, h, length, d in SHAPES:
        q, k, v = (
            torch.randn(b, h, length, d, device="cuda", dtype=torch.float16) for _ in range(3)
        )

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
        row = {
            "shape": f"B{b} H{h} L{length} D{d} fp16 causal",
            "path": decision.path,
            "family": family,
            "ours_us": round(statistics.median(samples["ours"]), 2),
            "sdpa_us": round(statistics.median(samples["sdpa"]), 2),
            "ours_rounds_us": [round(x, 2) for x in samples["ours"]],
            "sdpa_rounds_us": [round(x, 2) for x in samples["sdpa"]],
        }
        rows.append(row)
        print(
            f"{row['shape']}: ours {row['ours_us']} us/call ({decision.path}, {family}), "
            f"SDPA {row['sdpa_us']} us/call",
            flush=True,
        )
    Path(args.json).write_text(
        json.dumps(
            {
                "gpu": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "command": " ".join(["python", *sys.argv]),
                "rows": rows,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
