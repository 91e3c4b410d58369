"""Run one config on a small problem with tails, for compute-sanitizer (racecheck, synccheck).

compute-sanitizer --tool racecheck python3 benchmarks/probes/race_probe.py '<config json>'
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

from autotune.build import compile_config
from autotune.launch import CompiledKernel, torch_dtype
from autotune.measure import KVCase, make_kv_inputs
from autotune.model import Config, load_space, validate_config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="the config as JSON")
    config = validate_config(Config.from_json(parser.parse_args().config))
    build = compile_config(config)
    kernel = CompiledKernel(build)
    dtype = torch_dtype(str(config["dtype"]))
    d = int(config["head_dim"])
    # The last two problems have more work tiles than an H200 has SMs, so a persistent kernel
    # runs two, then four or five, tiles on a CTA (the K/V ring crossing work tiles; each of
    # the two Q buffers refilled after its O store; the next tile's first Q K^T under the
    # epilogue).
    problems: tuple[tuple[int, int, int, int, int], ...] = (
        (1, 2, 1, 200, 300),
        (1, 2, 1, 130, 64),
        (1, 16, 4, 1100, 900),
        (2, 32, 8, 1100, 900),
    )
    if kernel.split_kv:  # decode: a few query rows; its KV-cache paths below
        problems = ((1, 2, 1, 1, 300), (2, 8, 2, 5, 700), (2, 32, 8, 16, 900))

        def of_class(*sizes: Any, **kw: Any) -> KVCase:
            return KVCase.make(
                *sizes, head_dim=d, dtype=str(config["dtype"]), causal=bool(config["causal"]), **kw
            )

        cases: tuple[tuple[KVCase, int], ...] = (
            (of_class(3, 16, 2, 2, 512, (5, 333, 0), page_size=16), 4),
            (of_class(2, 8, 2, 3, 700, (700, 1)), 8),
            (of_class(3, 8, 1, 5, 600, (0, 600, 77)), 2),
        )  # two splits exchange rows
        if not load_space(config.family).kv_caches:  # a family of full contiguous caches
            cases = ((of_class(2, 16, 2, 16, 900, None), 4), (of_class(1, 32, 1, 3, 700, None), 8))
        for case, splits in cases:
            x = make_kv_inputs(case, "cuda")
            out, lse = kernel.with_kvcache(
                x.q,
                x.k_cache,
                x.v_cache,
                cache_seqlens=x.cache_seqlens,
                block_table=x.block_table,
                return_lse=True,
                num_splits=splits,
            )
            torch.cuda.synchronize()
            print(
                f"{build.name} {case.describe()} splits {splits}: "
                f"finite={bool(torch.isfinite(out).all())}"
            )
    for batch, heads_q, heads_kv, lq, lk in problems:
        q = torch.randn(batch, heads_q, lq, d, device="cuda", dtype=dtype)
        k = torch.randn(batch, heads_kv, lk, d, device="cuda", dtype=dtype)
        v = torch.randn(batch, heads_kv, lk, d, device="cuda", dtype=dtype)
        out, lse = kernel(q, k, v, return_lse=True)
        torch.cuda.synchronize()
        print(f"{build.name} Lq={lq} Lk={lk}: finite={bool(torch.isfinite(out).all())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
