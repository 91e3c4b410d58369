"""Exhaustive sweep: time every valid config of a family on a few shapes, SDPA beside it.

The recorded measurements are what the replay backend serves in CI (issue 3) and what the
search-efficiency study runs on. Every config goes through measure.trial.evaluate, the one trial
live tuning runs too (the validator, the check against SDPA's output at the shape, timing
alternating with SDPA's default), so replay and live tuning cannot disagree on what a trial is;
the validator's worst relative error is stored with the time, SDPA default's time beside it.

    python benchmarks/sweep.py --json tests/data/sweep_sm80_h200.json
    python benchmarks/sweep.py --family sm90 --shape-set llm-prefill --head-dim 128 \
        --dtype fp16 --causal false --json tests/data/sweep_sm90_h200.json.gz
    python benchmarks/sweep.py --family decode --shape-set llm-decode --pick 0 4 ... \
        --verdicts check_a.json check_b.json --json tests/data/sweep_decode_h200.json.gz

The problems are SHAPES below (the sm80 recording's), or a shape set's, filtered by head dim,
dtype and causality and picked by index. --verdicts takes the validation of each cubin from
`cute-autotune check --json` runs (several can run side by side on the GPU, which the timing
cannot), so the sweep only times. A name ending in .gz is written gzip-compressed.

One recording per family; `cute-autotune tune --replay A --replay B` serves several.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

import torch

from autotune.build import compile_many, family_source_hash
from autotune.build import current_toolchain as toolchain
from autotune.measure import (
    ValidationReport,
    describe_device,
    evaluate,
    remember_verdict,
    time_sdpa,
)
from autotune.model import Problem, default_target, load_shape_set, load_space

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


def read_verdicts(paths: list[str]) -> dict[str, ValidationReport]:
    """Validation reports by cubin, from `cute-autotune check --json` files run on the same
    kernel cache (one build serves every launch-time value of a config, split counts included,
    as in measure.trial)."""
    verdicts: dict[str, ValidationReport] = {}
    for path in paths:
        for row in json.loads(Path(path).read_text())["results"]:
            report = row["validation"].get("report")
            if report is not None and row.get("cubin"):
                verdicts[row["cubin"]] = ValidationReport.from_dict(report)
    return verdicts


def chosen_problems(args: argparse.Namespace) -> list[Problem]:
    """SHAPES, or the shape set's problems that pass the filters, picked by index."""
    if not args.shape_set:
        chosen = [SHAPES[i] for i in args.shapes] if args.shapes else SHAPES
        return [
            Problem(b, hq, hkv, length, length, d, dtype, causal)
            for dtype, d, causal, b, hq, hkv, length in chosen
        ]
    problems = [
        p
        for p in load_shape_set(args.shape_set)
        if (args.head_dim is None or p.head_dim == args.head_dim)
        and (args.dtype is None or p.dtype == args.dtype)
        and args.causal in ("both", str(p.causal).lower())
        and p.kv_cache == "dense"
    ]
    return [problems[i] for i in args.pick] if args.pick else problems


def sweep_shape(
    problem: Problem,
    rounds: int,
    round_ms: float,
    limit: int | None = None,
    family: str = "sm80",
    verdicts: dict[str, ValidationReport] | None = None,
    warmup_ms: float | None = None,
) -> dict[str, Any]:
    """Every valid config of `family` for `problem` through measure.trial.evaluate, the trial
    live tuning runs (validation, the check against SDPA at this shape, timing beside SDPA's
    default), then torch SDPA's backends timed together."""
    space, target = load_space(family), default_target()
    configs = space.valid_configs(target, problem.space_values())[:limit]
    device = torch.cuda.current_device()
    rows: list[dict[str, Any]] = []
    for build in compile_many(configs, target):
        report = (verdicts or {}).get(str(build.cubin))
        if build.ok and report is not None:
            remember_verdict(build, report)
        result = evaluate(
            problem, build, rounds=rounds, round_ms=round_ms, device=device, warmup_ms=warmup_ms
        )
        row: dict[str, Any] = {
            "name": build.name,
            "config": build.config.as_dict(),
            "status": result.status,
        }
        if build.ptxas:
            row.update(
                registers=build.ptxas.registers,
                spill_stores=build.ptxas.spill_store_bytes,
                spill_loads=build.ptxas.spill_load_bytes,
            )
        if result.reason:
            row["reason"] = result.reason
        if result.rel_err is not None:
            row["rel_err"] = result.rel_err
        if result.ok and result.median_us is not None:
            row.update(
                median_us=round(result.median_us, 3),
                p20_us=round(result.p20_us or result.median_us, 3),
                p80_us=round(result.p80_us or result.median_us, 3),
                tflops=round(problem.tflops(result.median_us), 2),
            )
            if result.baseline_us is not None:
                row["baseline_us"] = round(result.baseline_us, 3)
        rows.append(row)
    base = time_sdpa(problem, rounds=2 * rounds, round_ms=2 * round_ms)
    return {
        "problem": problem.as_dict(),
        "flops": problem.flops,
        "timing": {"rounds": rounds, "round_ms": round_ms, "warmup_ms": warmup_ms},
        "sdpa": {
            name: {**t.as_dict(), "tflops": round(problem.tflops(t.median_us), 2)}
            for name, t in base.items()
        },
        "configs": rows,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--family", default="sm80", help="kernel family to sweep")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--round-ms", type=float, default=10.0)
    parser.add_argument(
        "--warmup-ms",
        type=float,
        help="warm-up before each config's timed calls (default: the timing "
        "regime's 250 ms; the configs before keep the GPU busy and warm)",
    )
    parser.add_argument("--shapes", type=int, nargs="*", help="indices into SHAPES (default all)")
    parser.add_argument("--shape-set", help="take the problems from this shape set instead")
    parser.add_argument("--head-dim", type=int, help="only the shape set's problems of this D")
    parser.add_argument("--dtype", choices=["fp16", "bf16"], help="only this dtype's problems")
    parser.add_argument(
        "--causal",
        choices=["false", "true", "both"],
        default="both",
        help="only these masks' problems (default: both)",
    )
    parser.add_argument(
        "--pick",
        type=int,
        nargs="*",
        help="indices into the filtered shape set (default: all of it)",
    )
    parser.add_argument(
        "--verdicts",
        nargs="*",
        default=[],
        help="`cute-autotune check --json` files whose validations to reuse",
    )
    parser.add_argument(
        "--limit",
        type=int,
        help="only the first N configs of each shape (a smoke"
        " test; a recording for replay needs them all)",
    )
    args = parser.parse_args()
    verdicts = read_verdicts(args.verdicts)
    print(f"{len(verdicts)} validations taken from {len(args.verdicts)} check files", flush=True)
    results: list[dict[str, Any]] = []
    for problem in chosen_problems(args):
        result = sweep_shape(
            problem, args.rounds, args.round_ms, args.limit, args.family, verdicts, args.warmup_ms
        )
        timed = [r for r in result["configs"] if "tflops" in r]
        best = (
            f"best {max(timed, key=lambda r: r['tflops'])['name']} "
            f"{max(r['tflops'] for r in timed)} TFLOP/s"
            if timed
            else "nothing timed"
        )
        print(
            f"{problem.describe()}: {len(timed)}/{len(result['configs'])} timed, {best}; SDPA "
            + ", ".join(f"{k} {v['tflops']}" for k, v in result["sdpa"].items()),
            flush=True,
        )
        results.append(result)
        write_recording(args, results)  # after every problem: a killed sweep keeps its part
    return 0


def write_recording(args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    info = describe_device(torch.cuda.current_device()).as_dict()
    payload = {
        "gpu": torch.cuda.get_device_name(),
        "device": info,
        "torch": torch.__version__,
        "nvcc": toolchain().nvcc_version,
        "family": args.family,
        "source_hash": family_source_hash(load_space(args.family)),
        "command": " ".join(["python", *sys.argv]),
        "rounds": args.rounds,
        "round_ms": args.round_ms,
        "warmup_ms": args.warmup_ms,
        "shapes": results,
    }
    text = json.dumps(payload, separators=(",", ":")).encode()
    Path(args.json).write_bytes(
        gzip.compress(text, mtime=0) if args.json.endswith(".gz") else text
    )


if __name__ == "__main__":
    sys.exit(main())
