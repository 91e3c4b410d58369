"""Exhaustive sweep: time every valid config of a family on a few shapes, SDPA beside it.

The recorded measurements are what the replay backend serves in CI (issue 3) and what the
search-efficiency study runs on. Every config goes through measure.trial.evaluate, the one trial
live tuning runs too (the validator, the check against SDPA's output at the shape, timing
alternating with SDPA's default), so replay and live tuning cannot disagree on what a trial is;
the validator's worst relative error is stored with the time, SDPA default's time beside it.

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

from autotune.build import compile_many, family_source_hash
from autotune.build import current_toolchain as toolchain
from autotune.measure import describe_device, evaluate, time_sdpa
from autotune.model import Problem, default_target, load_space

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
    """Every valid config of `family` for `problem` through measure.trial.evaluate, the trial
    live tuning runs (validation, the check against SDPA at this shape, timing beside SDPA's
    default), then torch SDPA's backends timed together."""
    space, target = load_space(family), default_target()
    configs = space.valid_configs(target, problem.space_values())[:limit]
    device = torch.cuda.current_device()
    rows: list[dict[str, Any]] = []
    for build in compile_many(configs, target):
        result = evaluate(problem, build, rounds=rounds, round_ms=round_ms, device=device)
        row: dict[str, Any] = {"name": build.name, "config": build.config.as_dict(),
                               "status": result.status}
        if build.ptxas:
            row.update(registers=build.ptxas.registers, spill_stores=build.ptxas.spill_store_bytes,
                       spill_loads=build.ptxas.spill_load_bytes)
        if result.reason:
            row["reason"] = result.reason
        if result.rel_err is not None:
            row["rel_err"] = result.rel_err
        if result.ok and result.median_us is not None:
            row.update(median_us=round(result.median_us, 3),
                       p20_us=round(result.p20_us or result.median_us, 3),
                       p80_us=round(result.p80_us or result.median_us, 3),
                       tflops=round(problem.tflops(result.median_us), 2))
            if result.baseline_us is not None:
                row["baseline_us"] = round(result.baseline_us, 3)
        rows.append(row)
    base = time_sdpa(problem, rounds=2 * rounds, round_ms=2 * round_ms)
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
    info = describe_device(torch.cuda.current_device()).as_dict()
    payload = {"gpu": torch.cuda.get_device_name(), "device": info, "torch": torch.__version__,
               "nvcc": toolchain().nvcc_version, "family": args.family,
               "source_hash": family_source_hash(load_space(args.family)),
               "command": " ".join(["python", *sys.argv]), "shapes": results}
    Path(args.json).write_text(json.dumps(payload, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
