"""Batch-1 decode as engines run it: a decode step of many layers (each with its own KV cache)
captured in one CUDA graph, per-layer time = graph time / layers, for `attention_with_kvcache`
(dispatch as a user gets it) and for torch SDPA's default on the same tensors, and a read-only
streaming pass over the same cache bytes in a graph of the same layers (what the memory system
gives a kernel that only reads them). Replays alternate (ours, SDPA, streaming, ...), CUDA events
around each, median; a step's caches (layers x K and V) are far larger than L2, so each replay
reads them from memory as an engine's step does.

Per row: microseconds per layer, effective bandwidth (K and V bytes + Q + O over the time),
ours / streaming and ours / SDPA, and for rows with several query tokens the roofline
min(680 TFLOP/s, FLOP per byte x the streaming bandwidth) and ours as a share of it.

    python benchmarks/graph_decode.py [--layers 24] [--calls 40] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

# (B, Hq, Hkv, Lq, Lk, D): the batch-1 rows, bf16, causal (bottom-right)
ROWS = [
    (1, 32, 8, 1, 8192, 128),
    (1, 32, 8, 1, 32768, 128),
    (1, 32, 8, 4, 8192, 128),
    (1, 32, 8, 8, 16384, 128),
    (1, 32, 8, 16, 32768, 128),
]
PEAK_TFLOPS = 680.0  # dense bf16 tensor-core throughput the roofline caps at


def capture(step: Callable[[], Any]) -> Any:
    """A CUDA graph of `step`, captured after one eager call on a side stream (kernels loaded,
    launch plans made)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
    torch.cuda.current_stream().wait_stream(side)
    return graph


def run_row(row: tuple[int, ...], layers: int, calls: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    import autotune

    b, hq, hkv, lq, lk, d = row
    dtype = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)
    qs = [
        torch.randn(b, lq, hq, d, device="cuda", dtype=dtype, generator=g) for _ in range(layers)
    ]
    ks = [
        torch.randn(b, lk, hkv, d, device="cuda", dtype=dtype, generator=g) for _ in range(layers)
    ]
    vs = [
        torch.randn(b, lk, hkv, d, device="cuda", dtype=dtype, generator=g) for _ in range(layers)
    ]
    lengths = torch.full((b,), lk, dtype=torch.int32, device="cuda")
    mask = causal_lower_right(lq, lk) if lq > 1 else None

    def ours() -> None:
        for q, k, v in zip(qs, ks, vs, strict=True):
            autotune.attention_with_kvcache(q, k, v, cache_seqlens=lengths, causal=True)

    # SDPA on the same memory: [B, H, L, D] views of the [B, L, H, D] tensors (no copy)
    views = [
        (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        for q, k, v in zip(qs, ks, vs, strict=True)
    ]

    def sdpa() -> None:
        for q, k, v in views:
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

    sums = torch.empty(layers, 2, dtype=torch.float32, device="cuda")

    def streaming() -> None:
        for i, (k, v) in enumerate(zip(ks, vs, strict=True)):
            sums[i, 0] = k.sum(dtype=torch.float32)  # a reduction: reads every byte once
            sums[i, 1] = v.sum(dtype=torch.float32)

    graphs = {"ours": capture(ours), "sdpa": capture(sdpa), "streaming": capture(streaming)}
    times: dict[str, list[float]] = {name: [] for name in graphs}
    for i in range(calls + 3):
        for name, graph in graphs.items():
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            if i >= 3:
                times[name].append(start.elapsed_time(end) * 1e3 / layers)
    per_layer = {name: statistics.median(values) for name, values in times.items()}
    kv_bytes = 2 * b * lk * hkv * d * 2
    moved = kv_bytes + 2 * b * lq * hq * d * 2
    flops = 4.0 * b * hq * lq * lk * d
    stream_bw = kv_bytes / (per_layer["streaming"] * 1e-6)
    result: dict[str, Any] = {
        "row": {
            "batch": b,
            "heads_q": hq,
            "heads_kv": hkv,
            "seqlen_q": lq,
            "seqlen_k": lk,
            "head_dim": d,
            "dtype": "bf16",
            "causal": True,
        },
        "layers": layers,
        "us_per_layer": per_layer,
        "tb_per_s": {name: moved / (us * 1e-6) / 1e12 for name, us in per_layer.items()},
        "ours_over_streaming": per_layer["streaming"] / per_layer["ours"],
        "ours_over_sdpa": per_layer["sdpa"] / per_layer["ours"],
    }
    if lq > 1:
        attainable = min(PEAK_TFLOPS * 1e12, flops / moved * stream_bw)
        result["roofline_share"] = flops / (per_layer["ours"] * 1e-6) / attainable
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("graph_decode needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    for row in ROWS:
        try:
            result = run_row(row, args.layers, args.calls)
        except Exception as exc:  # noqa: BLE001 - a row that cannot be captured is a result
            print(f"{row}: failed: {exc}", flush=True)
            rows.append({"row": list(row), "error": str(exc)[:2000]})
            continue
        rows.append(result)
        r, us = result["row"], result["us_per_layer"]
        share = f" roofline {result['roofline_share']:.2f}" if "roofline_share" in result else ""
        print(
            f"B{r['batch']} H{r['heads_q']}/{r['heads_kv']} Lq{r['seqlen_q']} Lk{r['seqlen_k']}: "
            f"us/layer ours {us['ours']:.1f} sdpa {us['sdpa']:.1f} "
            f"streaming {us['streaming']:.1f}; "
            f"ours/streaming {result['ours_over_streaming']:.2f} ours/sdpa "
            f"{result['ours_over_sdpa']:.2f}{share}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"calls": args.calls, "layers": args.layers, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
