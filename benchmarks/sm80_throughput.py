"""Throughput of the fastest sm80 configs beside torch SDPA (default and FLASH), same run.

Screening: every candidate config (valid, compiled, and passed in a `cute-autotune check` JSON
when one is given) is timed briefly on the screening shape; the top N per (head_dim, causal) are
then re-timed with more rounds on every shape, interleaved with SDPA's default and FLASH
backends. Each timed output is compared with SDPA's (relative error) before its time counts.

    python benchmarks/sm80_throughput.py --check-json benchmarks/results/sm80_check_h200.json \
        --json benchmarks/results/sm80_throughput_h200.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from autotune.build.compiler import lookup
from autotune.cli.table import render_table
from autotune.launch.kernel import CompiledKernel
from autotune.launch.tensors import torch_dtype
from autotune.measure.timing import input_sets_needed, measure
from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.model.target import default_target


def parse_shape(text: str) -> tuple[int, int, int]:
    b, h, length = (int(x) for x in text.split(","))
    return b, h, length


def candidates(d: int, causal: bool, dtype: str, passed: set[str] | None,
               family: str = "sm80") -> list[CompiledKernel]:
    space, target = load_space(family), default_target()
    out = []
    for config in space.valid_configs(target, {"head_dim": d, "dtype": dtype, "causal": causal}):
        if passed is not None and config.to_json() not in passed:
            continue
        build = lookup(config, target)
        if build is not None and build.ptxas is not None:
            out.append(CompiledKernel(build))
    return out


def make_sets(problem: Problem, n: int) -> list[tuple[torch.Tensor, ...]]:
    dtype = torch_dtype(problem.dtype)
    shape_q = (problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim)
    shape_k = (problem.batch, problem.heads_kv, problem.seqlen_k, problem.head_dim)
    return [(torch.randn(shape_q, device="cuda", dtype=dtype),
             torch.randn(shape_k, device="cuda", dtype=dtype),
             torch.randn(shape_k, device="cuda", dtype=dtype),
             torch.empty(shape_q, device="cuda", dtype=dtype)) for _ in range(n)]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(a.float() - b.float()) /
                 torch.linalg.vector_norm(b.float()))


def time_kernels(problem: Problem, kernels: dict[str, CompiledKernel], with_sdpa: bool,
                 rounds: int, round_ms: float) -> tuple[dict[str, Any], dict[str, float]]:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    set_bytes = 4 * problem.batch * problem.heads_q * problem.seqlen_q * problem.head_dim * 2
    sets = make_sets(problem, input_sets_needed(set_bytes, l2))
    causal = problem.causal
    fns: dict[str, Any] = {}
    errors: dict[str, float] = {}
    q0, k0, v0, _ = sets[0]
    expected = F.scaled_dot_product_attention(q0, k0, v0, is_causal=causal)
    for name, kernel in kernels.items():
        out, _ = kernel(q0, k0, v0)
        errors[name] = rel_err(out, expected)
        fns[name] = (lambda i, kernel=kernel: kernel(*sets[i][:3], out=sets[i][3]))
    if with_sdpa:
        def sdpa_default(i: int) -> torch.Tensor:
            q, k, v = sets[i][:3]
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def flash(i: int) -> torch.Tensor:
            q, k, v = sets[i][:3]
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        fns["sdpa_default"] = sdpa_default
        fns["sdpa_flash"] = flash
    return measure(fns, n_sets=len(sets), rounds=rounds, round_ms=round_ms), errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--shapes", nargs="+", default=["4,16,2048", "1,16,8192"])
    parser.add_argument("--screen-shape", default="4,16,2048")
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--check-json", nargs="*", default=[],
                        help="only configs that passed in these check results")
    parser.add_argument("--family", default="sm80")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()

    passed = None
    if args.check_json:
        passed = set()
        for path in args.check_json:
            data = json.loads(Path(path).read_text())
            passed |= {Config.from_dict(r["config"]).to_json() for r in data["results"]
                       if r["validation"].get("status") == "passed"}
    space = load_space(args.family)
    rows: list[dict[str, Any]] = []
    screening: list[dict[str, Any]] = []
    for d in args.head_dims:
        for causal in (False, True):
            pool = candidates(d, causal, args.dtype, passed, args.family)
            if not pool:
                print(f"no candidates for D={d} causal={causal}", file=sys.stderr)
                continue
            b, h, length = parse_shape(args.screen_shape)
            screen = Problem(b, h, h, length, length, d, args.dtype, causal)
            named = {space.name_of(k.config): k for k in pool}
            timings, errors = time_kernels(screen, named, False, rounds=3, round_ms=10)
            for name, t in timings.items():
                screening.append({"name": name, "shape": args.screen_shape, "causal": causal,
                                  "head_dim": d, "tflops": screen.tflops(t.median_us),
                                  "median_us": t.median_us, "rel_err_vs_sdpa": errors[name]})
            ranked = sorted(timings, key=lambda n: timings[n].median_us)
            ranked = [n for n in ranked if errors[n] < 2e-2][: args.top]
            for shape in args.shapes:
                b, h, length = parse_shape(shape)
                problem = Problem(b, h, h, length, length, d, args.dtype, causal)
                top = {n: named[n] for n in ranked}
                timings2, errors2 = time_kernels(problem, top, True, rounds=9, round_ms=40)
                sdpa = problem.tflops(timings2["sdpa_default"].median_us)
                flash = problem.tflops(timings2["sdpa_flash"].median_us)
                for rank, name in enumerate(ranked):
                    t = timings2[name]
                    rows.append({
                        "dtype": args.dtype, "head_dim": d, "batch": b, "heads": h,
                        "seqlen": length, "causal": causal,
                        "config": named[name].config.as_dict(), "name": name,
                        "screen_rank": rank + 1, "tflops": round(problem.tflops(t.median_us), 1),
                        "median_us": round(t.median_us, 2), "p20_us": round(t.p20_us, 2),
                        "p80_us": round(t.p80_us, 2),
                        "sdpa_default_tflops": round(sdpa, 1),
                        "sdpa_flash_tflops": round(flash, 1),
                        "rel_err_vs_sdpa": errors2[name],
                    })
    print(render_table(
        ["D", "causal", "B,H,L", "config", "TFLOP/s", "SDPA default", "SDPA flash", "rel err"],
        [[r["head_dim"], r["causal"], f"{r['batch']},{r['heads']},{r['seqlen']}", r["name"],
          r["tflops"], r["sdpa_default_tflops"], r["sdpa_flash_tflops"],
          f"{r['rel_err_vs_sdpa']:.1e}"] for r in rows]))
    payload = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "validated_by": args.check_json,
               "command": " ".join(["python", *sys.argv]), "rows": rows,
               "screening": screening}
    Path(args.json).write_text(json.dumps(payload, indent=1, default=lambda x: None
                                          if isinstance(x, float) and math.isnan(x) else x))
    return 0


if __name__ == "__main__":
    sys.exit(main())
