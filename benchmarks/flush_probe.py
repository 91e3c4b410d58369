"""Whether the L2 flush itself costs the timed call: the same calls alternated twice, once with
the L2 flushed by writing a 512 MiB buffer (what every timing here does: the L2 is left full of
dirty lines, which the next call's reads evict and the L2 writes back to DRAM) and once by
reading it (the L2 left holding clean lines). A call that streams from DRAM at its bandwidth
should pay the write-back (up to the L2's size) in the first regime only.

    python benchmarks/flush_probe.py --json OUT.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode_bench import _first, alternating, write_probe  # noqa: E402

from autotune.measure import sdpa_call  # noqa: E402
from autotune.model import Config, Problem  # noqa: E402
from autotune.runtime import decode_kernel  # noqa: E402

# (problem, decode90 tile, splits): the bench's B=1 winners where the call streams at DRAM
# bandwidth (128k keys) and one where it does not (8k keys).
CASES = [
    (Problem(1, 32, 8, 1, 131072, 128, "bf16", False),
     {"block_m": 64, "block_n": 64, "consumer_wgs": 1, "kv_stages": 2, "overlap": False,
      "ctas_per_sm": 2}, 16),
    (Problem(1, 64, 8, 16, 32768, 128, "bf16", True),
     {"block_m": 128, "block_n": 128, "consumer_wgs": 2, "kv_stages": 3, "overlap": False,
      "ctas_per_sm": 1}, 16),
    (Problem(1, 32, 8, 1, 8192, 128, "bf16", False),
     {"block_m": 64, "block_n": 128, "consumer_wgs": 1, "kv_stages": 3, "overlap": False,
      "ctas_per_sm": 1}, 8),
    # Two 64-row tiles per KV head read each K/V tile: its loads stay evict-normal (a control
    # for decode90's evict-first hint).
    (Problem(1, 64, 8, 16, 32768, 128, "bf16", True),
     {"block_m": 64, "block_n": 128, "consumer_wgs": 1, "kv_stages": 3, "overlap": False,
      "ctas_per_sm": 1}, 8),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    buffer = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    words = buffer.view(torch.int32)
    flushes: dict[str, Callable[[], Any]] = {
        "write": buffer.zero_, "read": partial(torch.sum, words, dtype=torch.int64)}
    calls: dict[str, Any] = {}
    sizes: dict[str, int] = {}
    for p, tile, splits in CASES:
        q = torch.randn(1, p.seqlen_q, p.heads_q, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, p.seqlen_k, p.heads_kv, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        q_s, k_s, v_s = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        config = Config.make("decode90", {**p.space_values(), **tile, "num_splits": 1})
        kernel = decode_kernel(config, head_dim=128, dtype="bf16", causal=p.causal, device=0)
        calls[f"sdpa {p.describe()}"] = sdpa_call("default", q_s, k_s, v_s, causal=p.causal)
        calls[f"decode90 bm{tile['block_m']} x{splits} {p.describe()}"] = partial(
            _first, kernel.with_kvcache, q, k, v, num_splits=splits)
        sizes[f"sdpa {p.describe()}"] = p.bytes
        sizes[f"decode90 bm{tile['block_m']} x{splits} {p.describe()}"] = p.bytes
    rows = []
    for regime, flush in flushes.items():
        for name, us in alternating(calls, flush=flush).items():
            rows.append({"flush": regime, "call": name, "us": round(us, 2),
                         "tb_s": round(sizes[name] / us / 1e6, 3)})
    for r in rows:
        print(f"{r['flush']:<6} {r['call']:<50} {r['us']:8.2f} us {r['tb_s']:6.3f} TB/s")
    write_probe(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
