"""Run one config on a small problem with tails, for compute-sanitizer (racecheck, synccheck).

    compute-sanitizer --tool racecheck python3 benchmarks/race_probe.py '<config json>'
"""

from __future__ import annotations

import sys

import torch

from autotune.build import compile_config
from autotune.launch import CompiledKernel, torch_dtype
from autotune.model import Config, validate_config


def main() -> int:
    config = validate_config(Config.from_json(sys.argv[1]))
    build = compile_config(config)
    kernel = CompiledKernel(build)
    dtype = torch_dtype(str(config["dtype"]))
    d = int(config["head_dim"])
    # The last two problems have more work tiles than an H200 has SMs, so a persistent kernel
    # runs two, then four or five, tiles on a CTA (the K/V ring crossing work tiles; each of
    # the two Q buffers refilled after its O store; the next tile's first Q K^T under the
    # epilogue).
    for batch, heads_q, heads_kv, lq, lk in ((1, 2, 1, 200, 300), (1, 2, 1, 130, 64),
                                             (1, 16, 4, 1100, 900), (2, 32, 8, 1100, 900)):
        q = torch.randn(batch, heads_q, lq, d, device="cuda", dtype=dtype)
        k = torch.randn(batch, heads_kv, lk, d, device="cuda", dtype=dtype)
        v = torch.randn(batch, heads_kv, lk, d, device="cuda", dtype=dtype)
        out, lse = kernel(q, k, v, return_lse=True)
        torch.cuda.synchronize()
        print(f"{build.name} Lq={lq} Lk={lk}: finite={bool(torch.isfinite(out).all())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
