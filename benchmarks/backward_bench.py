"""The backward family against torch SDPA's backwards: per problem, a bwd config (the family's
default, or every config of `--configs`) and SDPA's default backward (cuDNN on the H200) and its
FLASH backend, in the plain alternating check (fixed order, L2 flushed and a GPU spin before
each call, CUDA events, median), in TFLOP/s with the backward counted as 2.5x the forward's
FLOPs (the issue's convention). Each config's gradients are first compared with SDPA's default
backward (the largest difference relative to the gradient's largest value printed; a config
off by more than MAX_REL_DIFF is reported, not timed).

The forward is SDPA's default too (its output and LSE from the efficient backend's
`_scaled_dot_product_efficient_attention`, which returns the LSE), so only the backward is timed.

    python benchmarks/backward_bench.py [--shapes default] [--calls 30] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

MAX_REL_DIFF = 2e-2
# (B, Hq, Hkv, L, D, causal): the figures are at GQA 32/8 4k-16k and D=64 2k-4k
Shape = tuple[int, int, int, int, int, bool]
DEFAULT_SHAPES: list[Shape] = [
    (1, 32, 8, 4096, 128, False),
    (1, 32, 8, 4096, 128, True),
    (1, 32, 8, 8192, 128, True),
    (2, 16, 16, 2048, 64, True),
    (2, 16, 16, 4096, 64, False),
]


def flops(b: int, hq: int, lq: int, lk: int, d: int, causal: bool) -> float:
    forward = 4.0 * b * hq * lq * lk * d
    if causal:
        forward /= 2
    return 2.5 * forward


def forward_with_lse(q: Any, k: Any, v: Any, causal: bool, scale: float) -> tuple[Any, Any]:
    """O and its LSE (fp32 [B, Hq, Lq], natural base) from the reference (exact, fp32)."""
    from autotune.measure import reference_attention

    out32, lse = reference_attention(q, k, v, causal=causal, scale=scale)
    return out32.to(q.dtype), lse.contiguous()


def run_shape(shape: Shape, configs: list[Any], calls: int, dtype_name: str) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from autotune.build import compile_many
    from autotune.launch import CompiledBackward
    from autotune.model import load_space

    b, hq, hkv, length, d, causal = shape
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(b, hq, length, d, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(b, hkv, length, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(b, hkv, length, d, device="cuda", dtype=dtype, generator=g)
    dout = torch.randn_like(q)
    scale = d**-0.5
    out, lse = forward_with_lse(q, k, v, causal, scale)

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    sdpa_out = F.scaled_dot_product_attention(
        leaves[0], leaves[1], leaves[2], is_causal=causal, enable_gqa=hq != hkv
    )

    def sdpa_backward() -> Any:
        return torch.autograd.grad(sdpa_out, leaves, dout, retain_graph=True)

    reference = sdpa_backward()
    flash_leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    fns: dict[str, Any] = {"sdpa_default": sdpa_backward}
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            flash_out = F.scaled_dot_product_attention(
                flash_leaves[0],
                flash_leaves[1],
                flash_leaves[2],
                is_causal=causal,
                enable_gqa=hq != hkv,
            )
        fns["sdpa_flash"] = lambda: torch.autograd.grad(
            flash_out, flash_leaves, dout, retain_graph=True
        )
    except RuntimeError:
        pass

    space = load_space("bwd")
    problem: dict[str, int | bool | str] = {"head_dim": d, "dtype": dtype_name, "causal": causal}
    default = space.heuristic(problem)
    chosen = [space.validate(c) for c in configs] or ([default] if default else [])
    chosen = [c for c in chosen if all(c[key] == value for key, value in problem.items())]
    errors: dict[str, float] = {}
    for build in compile_many(chosen):
        name = space.name_of(build.config)
        if not build.ok:
            errors[name] = float("nan")
            continue
        kernel = CompiledBackward(build)
        got = kernel(q, k, v, out, dout, lse, scale=scale)
        # the largest difference of any gradient, relative to that gradient's largest value
        # (a dK of a long causal problem reaches tens, where bf16 rounds in steps of 1/16)
        err = max(
            float((a.float() - r.float()).abs().max() / r.float().abs().max().clamp_min(1.0))
            for a, r in zip(got, reference, strict=True)
        )
        errors[name] = err
        if err <= MAX_REL_DIFF:
            fns[name] = (lambda kern: lambda: kern(q, k, v, out, dout, lse, scale=scale))(kernel)

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    scratch = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")
    times: dict[str, list[tuple[Any, Any]]] = {name: [] for name in fns}
    for i in range(5 + calls):
        for name, fn in fns.items():
            scratch.zero_()
            torch.cuda._sleep(100_000)
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            if i >= 5:
                times[name].append((start, end))
    torch.cuda.synchronize()
    median_us = {
        name: statistics.median(s.elapsed_time(e) * 1e3 for s, e in pairs)
        for name, pairs in times.items()
    }
    work = flops(b, hq, length, length, d, causal)
    return {
        "shape": {
            "batch": b,
            "heads_q": hq,
            "heads_kv": hkv,
            "seqlen": length,
            "head_dim": d,
            "causal": causal,
            "dtype": dtype_name,
        },
        "median_us": median_us,
        "tflops": {name: work / (us * 1e-6) / 1e12 for name, us in median_us.items()},
        "max_rel_diff_vs_sdpa": errors,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--dtype", choices=["fp16", "bf16"], default="bf16")
    parser.add_argument(
        "--configs",
        help="a JSON file of bwd configs to time (default: the family's default per head dim)",
    )
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("backward_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    from autotune.model import Config

    configs = []
    if args.configs:
        with open(args.configs) as f:
            configs = [Config.from_dict(c) for c in json.load(f)]
    rows = []
    for shape in DEFAULT_SHAPES:
        row = run_shape(shape, configs, args.calls, args.dtype)
        rows.append(row)
        s = row["shape"]
        cells = "  ".join(f"{n} {t:.0f}" for n, t in row["tflops"].items())
        print(
            f"B{s['batch']} H{s['heads_q']}/{s['heads_kv']} L{s['seqlen']} D{s['head_dim']} "
            f"{'causal' if s['causal'] else 'full'} {s['dtype']}: TFLOP/s {cells}; "
            f"max|d - sdpa|/max|sdpa| {row['max_rel_diff_vs_sdpa']}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"calls": args.calls, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
