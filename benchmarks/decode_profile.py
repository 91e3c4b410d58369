"""One decode kernel call, repeated, for Nsight Compute: what limits a B=1 decode call (the
DRAM throughput it reaches, the CTAs an SM holds, where its warps wait).

    ncu --clock-control none -k regex:cute_autotune_fwd --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats python3 benchmarks/decode_profile.py \
        --problem 1,64,8,16,32768 --causal --splits 16 '<decode90 tile json>'

The problem is B,Hq,Hkv,Lq,Lk at D=128 bf16 in the bench's layout ([B, L, H, D]); the tile is a
decode or decode90 config without problem or launch values.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from autotune.model import Config, Problem
from autotune.runtime import decode_kernel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tile", help="JSON: the config's tunable values and its family")
    parser.add_argument("--problem", required=True, help="B,Hq,Hkv,Lq,Lk")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--splits", type=int, default=1)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    b, hq, hkv, lq, lk = (int(x) for x in args.problem.split(","))
    problem = Problem(b, hq, hkv, lq, lk, 128, "bf16", args.causal)
    tile = json.loads(args.tile)
    family = tile.pop("family")
    config = Config.make(family, {**problem.space_values(), **tile, "num_splits": 1})
    kernel = decode_kernel(config, head_dim=128, dtype="bf16", causal=args.causal, device=0)
    q = torch.randn(b, lq, hq, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, lk, hkv, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    for _ in range(args.calls):
        kernel.with_kvcache(q, k, v, num_splits=args.splits)
    torch.cuda.synchronize()
    print(f"{problem} {json.dumps(tile)} splits {args.splits}: {args.calls} calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
