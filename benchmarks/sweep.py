"""Exhaustive sweep: time every valid config of a family on a few shapes, SDPA beside it.

The recorded measurements are what the replay backend serves in CI (issue 3) and what the
search-efficiency study runs on. Every timed config's output is first compared with SDPA's on
the same inputs; its relative error is stored with its time.

    python benchmarks/sweep.py --json tests/data/sweep_sm80_h200.json
    python benchmarks/sweep.py --family sm90 --json tests/data/sweep_sm90_h200.json

One recording per family; `cute-autotune tune --replay A --replay B` serves several.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from autotune.build.compiler import compile_many
from autotune.build.toolchain import family_source_hash, toolchain
from autotune.launch.kernel import CompiledKernel
from autotune.launch.tensors import torch_dtype
from autotune.measure.gpu_tasks import task_device_info
from autotune.measure.sdpa import accepted_backends
from autotune.measure.timing import input_sets_needed, measure
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.model.target import default_target

# (dtype, D, causal, B, Hq, Hkv, L): shapes of the llm-prefill set, both dtypes, GQA included.
SHAPES = [
    ("fp16", 128, False, 4, 16, 16, 2048),
    ("fp16", 128, True, 4, 16, 16, 2048),
    ("fp16", 128, False, 1, 16, 16, 8192),
    ("bf16", 64, True, 1, 16, 16, 8192),
    ("fp16", 64, False, 16, 16, 16, 512),
    ("bf16", 128, True, 2, 32, 8, 4096),
    ("fp16", 64, True, 4, 32, 8, 2048),
]


def sweep_shape(problem: Problem, rounds: int, round_ms: float, limit: int | None = None,
                family: str = "sm80") -> dict[str, Any]:
    space, target = load_space(family), default_target()
    configs = space.valid_configs(target, problem.space_values())[:limit]
    builds = compile_many(configs, target)
    dtype = torch_dtype(problem.dtype)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    q_elems = problem.batch * problem.heads_q * problem.seqlen_q * problem.head_dim
    kv_elems = problem.batch * problem.heads_kv * problem.seqlen_k * problem.head_dim
    n_sets = input_sets_needed((2 * q_elems + 2 * kv_elems) * 2, l2)
    sets = []
    for _ in range(n_sets):
        q = torch.randn(problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim,
                        device="cuda", dtype=dtype)
        k, v = (torch.randn(problem.batch, problem.heads_kv, problem.seqlen_k, problem.head_dim,
                            device="cuda", dtype=dtype) for _ in range(2))
        sets.append((q, k, v, torch.empty_like(q)))
    q0, k0, v0, _ = sets[0]
    baselines = {name: [accepted_backends(*s[:3], causal=problem.causal)[name] for s in sets]
                 for name in accepted_backends(q0, k0, v0, causal=problem.causal)}
    expected = baselines["default"][0]().float()

    rows: list[dict[str, Any]] = []
    fns = {}
    for build in builds:
        row: dict[str, Any] = {"name": build.name, "config": build.config.as_dict(),
                               "status": build.status}
        if build.ptxas:
            row.update(registers=build.ptxas.registers, spill_stores=build.ptxas.spill_store_bytes,
                       spill_loads=build.ptxas.spill_load_bytes)
        if build.ok:
            kernel = CompiledKernel(build)
            out, _ = kernel(q0, k0, v0)
            err = float((out.float() - expected).norm() / expected.norm())
            row["rel_err_vs_sdpa"] = err
            if err < 2e-2 and bool(torch.isfinite(out).all()):
                fns[build.name] = (lambda i, kernel=kernel: kernel(*sets[i][:3], out=sets[i][3]))
            else:
                row["status"] = "wrong_result"
        else:
            row["reason"] = build.message
        rows.append(row)
    timings = measure(fns, n_sets=n_sets, rounds=rounds, round_ms=round_ms)
    for row in rows:
        t = timings.get(row["name"])
        if t is not None:
            row.update(median_us=round(t.median_us, 3), p20_us=round(t.p20_us, 3),
                       p80_us=round(t.p80_us, 3), tflops=round(problem.tflops(t.median_us), 2))
    base_fns = {name: (lambda i, calls=calls: calls[i]()) for name, calls in baselines.items()}
    base = measure(base_fns, n_sets=n_sets, rounds=2 * rounds, round_ms=2 * round_ms)
    return {"problem": problem.as_dict(), "flops": problem.flops,
            "sdpa": {name: {**t.as_dict(), "tflops": round(problem.tflops(t.median_us), 2)}
                     for name, t in base.items()},
            "configs": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--family", default="sm80", help="kernel family to sweep")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--round-ms", type=float, default=10.0)
    parser.add_argument("--shapes", type=int, nargs="*", help="indices into SHAPES (default all)")
    parser.add_argument("--limit", type=int, help="only the first N configs of each shape (a smoke"
                        " test; a recording for replay needs them all)")
    args = parser.parse_args()
    chosen = [SHAPES[i] for i in args.shapes] if args.shapes else SHAPES
    results = []
    for dtype, d, causal, b, hq, hkv, length in chosen:
        problem = Problem(b, hq, hkv, length, length, d, dtype, causal)
        result = sweep_shape(problem, args.rounds, args.round_ms, args.limit, args.family)
        timed = [r for r in result["configs"] if "tflops" in r]
        best = max(timed, key=lambda r: r["tflops"])
        print(f"{problem.describe()}: {len(timed)}/{len(result['configs'])} timed, best "
              f"{best['name']} {best['tflops']} TFLOP/s; SDPA "
              + ", ".join(f"{k} {v['tflops']}" for k, v in result["sdpa"].items()), flush=True)
        results.append(result)
    info = task_device_info({"device": torch.cuda.current_device()})
    info.pop("status")
    payload = {"gpu": torch.cuda.get_device_name(), "device": info, "torch": torch.__version__,
               "nvcc": toolchain().nvcc_version, "family": args.family,
               "source_hash": family_source_hash(load_space(args.family)),
               "command": " ".join(["python", *sys.argv]), "shapes": results}
    Path(args.json).write_text(json.dumps(payload, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
