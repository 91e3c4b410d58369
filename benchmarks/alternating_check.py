"""The plain alternating-call check: a measurement kept independent of the tuner's timing code, to
hold the tuner's regime to account. Eager calls through the public APIs, `autotune.attention` then
`F.scaled_dot_product_attention` (then each SDPA backend that accepts the problem, under
`sdpa_kernel`), in that fixed order, the L2 flushed before each call (then a ~50 us GPU spin,
so the host has issued the call before its start event fires: GPU time, host overhead apart),
CUDA events around each, the median per callable.

    python benchmarks/alternating_check.py --db URL --shapes llm-prefill [--calls 60]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from collections.abc import Callable
from typing import Any


def _sdpa(q: Any, k: Any, v: Any, causal: bool, backend: str | None) -> Callable[[], Any]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    kwargs: dict[str, Any] = {}
    if q.shape[1] != k.shape[1]:
        kwargs["enable_gqa"] = True
    if causal and q.shape[2] == k.shape[2]:
        kwargs["is_causal"] = True
    elif causal and q.shape[2] > 1:  # one query, bottom-right, sees every key: no mask
        kwargs["attn_mask"] = causal_lower_right(q.shape[2], k.shape[2])
    if backend is None:
        return lambda: F.scaled_dot_product_attention(q, k, v, **kwargs)
    chosen = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
    }[backend]

    def call() -> Any:
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)

    return call


def alternating(
    problem: Any,
    *,
    calls: int = 60,
    warmup: int = 10,
    spin_cycles: int = 100_000,
    layout: str = "bhld",
    extra: Callable[[Any, Any, Any], dict[str, Callable[[], Any]]] | None = None,
) -> dict[str, Any]:
    """Median microseconds per callable: ours (`attention`), SDPA's default, SDPA's backends,
    then whatever `extra(q, k, v)` adds, on inputs in `layout` ("blhd": [B, L, H, D], SDPA
    handed the transposed views as a caller of that layout would). Per callable beside SDPA's
    default, the call-by-call ratios' median and 20th/80th percentiles: a speed-up's spread."""
    import torch

    import autotune

    def shape(heads: int, length: int) -> tuple[int, ...]:
        return (
            (problem.batch, heads, length, problem.head_dim)
            if layout == "bhld"
            else (problem.batch, length, heads, problem.head_dim)
        )

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[problem.dtype]
    q = torch.randn(shape(problem.heads_q, problem.seqlen_q), device="cuda", dtype=dtype)
    k = torch.randn(shape(problem.heads_kv, problem.seqlen_k), device="cuda", dtype=dtype)
    v = torch.randn(shape(problem.heads_kv, problem.seqlen_k), device="cuda", dtype=dtype)
    qb, kb, vb = (t if layout == "bhld" else t.transpose(1, 2) for t in (q, k, v))
    causal = problem.causal
    fns: dict[str, Callable[[], Any]] = {
        "ours": lambda: autotune.attention(q, k, v, causal=causal, layout=layout),
        "sdpa_default": _sdpa(qb, kb, vb, causal, None),
    }
    for backend in ("flash", "efficient", "cudnn"):
        fn = _sdpa(qb, kb, vb, causal, backend)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                fn()
            except RuntimeError:
                continue
        fns[f"sdpa_{backend}"] = fn
    if extra is not None:
        fns.update(extra(q, k, v))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    scratch = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
    times: dict[str, list[tuple[Any, Any]]] = {name: [] for name in fns}
    for i in range(warmup + calls):
        for name, fn in fns.items():
            scratch.zero_()
            torch.cuda._sleep(spin_cycles)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            if i >= warmup:
                times[name].append((start, end))
    torch.cuda.synchronize()
    us = {name: [s.elapsed_time(e) * 1e3 for s, e in pairs] for name, pairs in times.items()}
    medians = {name: statistics.median(values) for name, values in us.items()}
    ours = medians["ours"]
    decision = autotune.explain(q, k, v, causal=causal, layout=layout)
    return {
        "shape": problem.describe(),
        "problem": problem.as_dict(),
        "layout": layout,
        "calls": calls,
        "dispatch": decision.config.to_json() if decision.config else decision.path,
        "decision": decision.describe(),
        "median_us": medians,
        "speedup_vs_sdpa_default": medians["sdpa_default"] / ours,
        "ratio_vs_sdpa_default": {
            name: _quantiles(us["sdpa_default"], values)
            for name, values in us.items()
            if name != "sdpa_default"
        },
        "regret": ours / min(medians.values()),
    }


def _quantiles(reference: list[float], values: list[float]) -> dict[str, float]:
    """reference / value call by call (the alternation pairs them): median, p20, p80."""
    ratios = sorted(r / v for r, v in zip(reference, values, strict=True))
    cut = statistics.quantiles(ratios, n=5) if len(ratios) > 1 else ratios * 4
    return {"median": statistics.median(ratios), "p20": cut[0], "p80": cut[-1]}


def main() -> int:
    import autotune
    from autotune.model import load_shape_set

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", required=True)
    parser.add_argument("--shapes", nargs="+", required=True)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--json")
    parser.add_argument(
        "--spin-cycles",
        type=int,
        default=100_000,
        help="GPU spin before each call (100000: ~50 us); more where a call's "
        "host work is longer (a decode call's)",
    )
    args = parser.parse_args()
    autotune.configure(db=args.db)
    rows = []
    for name in args.shapes:
        for problem in load_shape_set(name):
            row = alternating(problem, calls=args.calls, spin_cycles=args.spin_cycles)
            rows.append(row)
            times = row["median_us"]
            print(
                f"{row['shape']:<40} ours {times['ours']:9.1f} us  SDPA "
                f"{times['sdpa_default']:9.1f} us  {row['speedup_vs_sdpa_default']:.3f}x"
                f"  regret {row['regret']:.3f}  {row['dispatch'][:60]}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
