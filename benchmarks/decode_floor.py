"""The fixed cost of a decode call at B=1, Lq=1 against what its keys cost: the floor of the
timing itself (a one-element fill timed the same way), each decode family's call on a 128-key
cache (next to nothing to stream) and on the bench's 8k-key cache at split counts 1, 8 and 16
(decode90 with two CTAs per SM also 32), and SDPA's default on both, all in one plain
alternating check (L2 flushed before each call, median of 41). decode90's split calls of up to
8 splits reduce them in a thread-block cluster; each is also timed with the combine entry
instead ("entry"). The 2.5 TB/s target at Lk=8k is 13.4 us for the whole call.

    python benchmarks/decode_floor.py --json OUT.json
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import Any

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode_bench import _first, alternating, write_probe  # noqa: E402

from autotune.measure import sdpa_call  # noqa: E402
from autotune.model import Config, Problem  # noqa: E402
from autotune.runtime import decode_kernel  # noqa: E402

# The winners of each family at B1 H32/8 Lq1 Lk8k (decode: the exhaustive sweep's best tile;
# decode90: the Lq>=4 bench's B=1 winner), and decode90's tile for two CTAs per SM.
TILES = {
    "decode": ("decode", {"block_m": 16, "block_n": 64, "num_warps": 4, "kv_stages": 3,
                          "pack_gqa": True}),
    "decode90": ("decode90", {"block_m": 64, "block_n": 128, "consumer_wgs": 1, "kv_stages": 3,
                              "overlap": False}),
    "decode90c2": ("decode90", {"block_m": 64, "block_n": 64, "consumer_wgs": 1, "kv_stages": 2,
                                "overlap": False, "ctas_per_sm": 2}),
}
SPLITS = {"decode": (1, 8, 16), "decode90": (1, 8, 16), "decode90c2": (1, 8, 16, 32)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    calls: dict[str, Any] = {}
    fill = torch.zeros(1, device="cuda")
    calls["one-element fill"] = fill.zero_
    sizes: dict[str, int] = {}
    for lk in (128, 8192):
        p = Problem(1, 32, 8, 1, lk, 128, "bf16", False)
        q = torch.randn(1, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, lk, 8, 128, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        q_s, k_s, v_s = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        calls[f"sdpa Lk{lk}"] = sdpa_call("default", q_s, k_s, v_s, causal=False)
        sizes[f"sdpa Lk{lk}"] = p.bytes
        for label, (family, tile) in TILES.items():
            config = Config.make(family, {**p.space_values(), **tile, "num_splits": 1})
            kernel = decode_kernel(config, head_dim=128, dtype="bf16", causal=False, device=0)
            for splits in SPLITS[label]:
                name = f"{label} Lk{lk} x{splits}"
                calls[name] = partial(_first, kernel.with_kvcache, q, k, v, num_splits=splits)
                sizes[name] = p.bytes
                if 1 < splits <= 8 and family == "decode90":  # the same without the cluster
                    calls[f"{name} entry"] = partial(_first, kernel.with_kvcache, q, k, v,
                                                     num_splits=splits, cluster_combine=False)
                    sizes[f"{name} entry"] = p.bytes
    times = alternating(calls)
    rows = [{"call": name, "us": round(us, 2),
             "tb_s": round(sizes[name] / us / 1e6, 3) if name in sizes else None}
            for name, us in times.items()]
    for r in rows:
        print(f"{r['call']:<24} {r['us']:8.2f} us  {r['tb_s'] or '':>6} TB/s")
    write_probe(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
