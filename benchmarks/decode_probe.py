"""Where a decode call's time goes, for the two classes the decode bench leaves below target:

- B=1, Lq=1 (latency-bound): each split count's call timed whole (plain alternating check, L2
  flushed) and its two kernels apart (torch profiler: the split kernel `cute_autotune_fwd` and
  the combine `cute_autotune_combine`), and the same call on an 8-key cache (the fixed cost of
  the launch, the prologue, the epilogue and the combine, with next to no keys to stream).
- Paged caches (B=8, Lk=32k): the contiguous cache against the same keys in pages of 16 and 64,
  the pages in order (block table = identity) and shuffled, with the contiguous winner's config
  and then with each paged cache's own best of the bench's candidate tiles x split counts. In
  order against shuffled separates the loader's instructions from the address pattern.

    python benchmarks/decode_probe.py --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from functools import partial
from typing import Any

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from decode_bench import SPLITS, _first, alternating, configs_for, paged  # noqa: E402

from autotune.model import Config, Problem  # noqa: E402
from autotune.runtime import decode_kernel  # noqa: E402

B1 = [Problem(1, 32, 8, 1, 8192, 128, "bf16", False),
      Problem(1, 32, 8, 1, 32768, 128, "bf16", False)]
B1_CONFIG = {"block_m": 16, "block_n": 64, "num_warps": 4, "kv_stages": 3, "pack_gqa": True}
PAGED_PROBLEM = Problem(8, 32, 8, 1, 32768, 128, "bf16", False)
PAGED_CONFIG = {**B1_CONFIG, "num_splits": 2}


def kernel_times(call: Any, reps: int = 20) -> dict[str, float]:
    """Median device microseconds per kernel name over `reps` calls (torch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    per: dict[str, list[float]] = {}
    for event in trace.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:  # type: ignore[attr-defined]
            per.setdefault(event.name, []).append(event.device_time)
    return {name: sorted(v)[len(v) // 2] for name, v in per.items()}


def config_of(problem: Problem, values: dict[str, Any]) -> Config:
    return Config.make("decode", {"head_dim": problem.head_dim, "dtype": problem.dtype,
                                  "causal": problem.causal, "num_splits": 1, **values})


def tensors(problem: Problem) -> tuple[torch.Tensor, ...]:
    dtype = torch.bfloat16 if problem.dtype == "bf16" else torch.float16
    b, hq, hkv, lq, lk, d = (problem.batch, problem.heads_q, problem.heads_kv,
                             problem.seqlen_q, problem.seqlen_k, problem.head_dim)
    return (torch.randn(b, lq, hq, d, device="cuda", dtype=dtype),
            torch.randn(b, lk, hkv, d, device="cuda", dtype=dtype),
            torch.randn(b, lk, hkv, d, device="cuda", dtype=dtype))


def latency_rows() -> list[dict[str, Any]]:
    rows = []
    for problem in B1:
        q, k, v = tensors(problem)
        kernel = decode_kernel(config_of(problem, B1_CONFIG), head_dim=problem.head_dim,
                               dtype=problem.dtype, causal=problem.causal, device=0)
        tiny = (k[:, :8].contiguous(), v[:, :8].contiguous())
        for splits in (1, 4, 8, 16, 32):
            call = partial(_first, kernel.with_kvcache, q, k, v, num_splits=splits)
            fixed = partial(_first, kernel.with_kvcache, q, *tiny, num_splits=1)
            fixed_split = partial(_first, kernel.with_kvcache, q, *tiny, num_splits=splits)
            t = alternating({"call": call, "fixed": fixed, "fixed_split": fixed_split}, n=31)
            parts = kernel_times(call)
            rows.append({"shape": problem.describe(), "num_splits": splits,
                         "call_us": round(t["call"], 2),
                         "tb_s": round(problem.bytes / t["call"] / 1e6, 3),
                         "eight_keys_one_split_us": round(t["fixed"], 2),
                         "eight_keys_same_splits_us": round(t["fixed_split"], 2),
                         "kernels_us": {n: round(x, 2) for n, x in parts.items()}})
            print(rows[-1], flush=True)
    return rows


def best_of(problem: Problem, run: Any) -> tuple[str, float]:
    """The fastest of the bench's candidates x split counts, `run(kernel, splits)` giving a
    call; timed by the alternating check in groups (short, L2 flushed)."""
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    calls = {}
    for config in configs_for(problem):
        ctas = math.ceil(problem.seqlen_q * problem.group_size / int(config["block_m"])) * \
            problem.batch * problem.heads_kv
        kernel = decode_kernel(config, head_dim=problem.head_dim, dtype=problem.dtype,
                               causal=problem.causal, device=0)
        for splits in SPLITS:
            if splits > 1 and ctas * splits > 4 * sm_count:
                break
            calls[config.replace(num_splits=splits).to_json()] = run(kernel, splits)
    times: dict[str, float] = {}
    names = list(calls)
    for i in range(0, len(names), 8):
        times.update(alternating({n: calls[n] for n in names[i:i + 8]}, n=9))
    best = min(times, key=times.__getitem__)
    return best, times[best]


def paged_rows() -> list[dict[str, Any]]:
    problem = PAGED_PROBLEM
    q, k, v = tensors(problem)
    kernel = decode_kernel(config_of(problem, PAGED_CONFIG), head_dim=problem.head_dim,
                           dtype=problem.dtype, causal=problem.causal, device=0)
    contiguous = partial(_first, kernel.with_kvcache, q, k, v)
    own_contig, own_contig_us = best_of(
        problem, lambda kern, s: partial(_first, kern.with_kvcache, q, k, v, num_splits=s))
    rows = []
    for page_size in (16, 64):
        (k_s, v_s), shuffled = paged((k, v), page_size, page_size)
        in_order = (k.reshape(-1, page_size, *k.shape[2:]), v.reshape(-1, page_size, *v.shape[2:]))
        identity = torch.arange(in_order[0].shape[0], device="cuda", dtype=torch.int32).view(
            problem.batch, -1)

        def call(kern: Any, splits: int, kc: torch.Tensor, vc: torch.Tensor,
                 table: torch.Tensor) -> Any:
            return partial(_first, kern.with_kvcache, q, kc, vc, block_table=table,
                           num_splits=splits)

        t = alternating({"contiguous": contiguous,
                         "in_order": call(kernel, 2, *in_order, identity),
                         "shuffled": call(kernel, 2, k_s, v_s, shuffled)}, n=31)
        own, own_us = best_of(problem, lambda kern, s, kc=k_s, vc=v_s, table=shuffled:
                              call(kern, s, kc, vc, table))
        rows.append({"shape": problem.describe(), "page_size": page_size,
                     "contiguous_us": round(t["contiguous"], 2),
                     "paged_in_order_us": round(t["in_order"], 2),
                     "paged_shuffled_us": round(t["shuffled"], 2),
                     "shuffled_own_best": json.loads(own),
                     "shuffled_own_best_us": round(own_us, 2),
                     "contiguous_own_best": json.loads(own_contig),
                     "contiguous_own_best_us": round(own_contig_us, 2)})
        print(rows[-1], flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "command": "benchmarks/decode_probe.py " + " ".join(sys.argv[1:]),
           "latency": latency_rows(), "paged": paged_rows()}
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
