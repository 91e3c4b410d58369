"""Why a tuned kernel times lower in `bench` than in its tuning session: the same kernel timed
(1) alone, as the tuner's trial does; (2) through `attention()`, alone; (3) both beside torch
SDPA's default, interleaved round by round as `bench` does; with the SM clock and power drawn
sampled by nvidia-smi during each mode (its samples are coarse: power.draw is a running
average, so a mode shorter than a second reads partly idle).

    python benchmarks/interleave_probe.py --db sqlite:///.tuning/h200.db --json out.json

With `--settle-s S` each mode first runs its calls untimed for S seconds, so the timed rounds
(and the clock and power samples) see the GPU power-steady, as a long-running workload does;
`--problem B,Hq,Hkv,L,D,dtype,causal` (repeatable) replaces the default problems.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from autotune import attention, configure
from autotune.build import compile_config
from autotune.launch import CompiledKernel
from autotune.measure import measure, problem_inputs, sdpa_call
from autotune.model import Problem
from autotune.tune import best_config

PROBLEMS = [Problem(4, 16, 16, 2048, 2048, 128, "fp16", False),
            Problem(1, 16, 16, 8192, 8192, 128, "fp16", False),
            Problem(16, 16, 16, 512, 512, 128, "fp16", True)]


def sampled(log: Path, start: float, end: float) -> dict[str, float]:
    clocks, power = [], []
    for line in log.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            t, clock, watts = float(parts[0]), float(parts[1]), float(parts[2])
        except (ValueError, IndexError):
            continue
        if start <= t <= end:
            clocks.append(clock)
            power.append(watts)
    return {"sm_clock_mhz": statistics.median(clocks) if clocks else float("nan"),
            "power_w": statistics.median(power) if power else float("nan")}


def calls(problem: Problem, kernel: CompiledKernel, sets: list[tuple[Any, ...]]
          ) -> dict[str, Callable[[int], Any]]:
    causal = problem.causal
    # as `bench` calls it (enable_gqa where Hq != Hkv, which --problem allows)
    sdpa = [sdpa_call("default", *s[:3], causal=causal) for s in sets]
    return {
        "kernel (tuner's call)": lambda i: kernel(*sets[i][:3], out=sets[i][3]),
        "attention()": lambda i: attention(*sets[i][:3], causal=causal),
        "sdpa default": lambda i: sdpa[i](),
    }


def parse_problem(text: str) -> Problem:
    b, hq, hkv, length, d, dtype, causal = text.split(",")
    return Problem(int(b), int(hq), int(hkv), int(length), int(length), int(d), dtype,
                   causal == "true")


def settle(candidates: dict[str, Callable[[int], Any]], n_sets: int, seconds: float) -> None:
    """Run the candidates untimed, round-robin, until `seconds` of wall time have passed."""
    deadline = time.time() + seconds
    i = 0
    while time.time() < deadline:
        for fn in candidates.values():
            for _ in range(8):
                fn(i % n_sets)
                i += 1
        torch.cuda.synchronize()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--problem", action="append", type=parse_problem,
                    help="B,Hq,Hkv,L,D,dtype,causal (repeatable; default: three problems)")
    ap.add_argument("--settle-s", type=float, default=0.0,
                    help="untimed run of each mode before its timed rounds")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    configure(db=args.db)
    log = Path(tempfile.mkdtemp()) / "smi.csv"
    # epoch seconds, SM clock, power, every 20 ms
    smi = subprocess.Popen(
        ["bash", "-c", "nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,"
         "nounits -lms 20 | while read l; do echo \"$(date +%s.%N), $l\"; done"],
        stdout=log.open("w"), start_new_session=True)
    rows = []
    try:
        for problem in args.problem or PROBLEMS:
            answer = best_config(problem, db=args.db)
            if answer is None:
                print(f"{problem.describe()}: not tuned in {args.db}", file=sys.stderr)
                continue
            kernel = CompiledKernel(compile_config(answer.record.config))
            sets = problem_inputs(problem)
            fns = calls(problem, kernel, sets)
            modes = [(f"{name} alone", {name: fn}) for name, fn in fns.items()]
            modes.append(("all three interleaved", fns))
            for mode, candidates in modes:
                time.sleep(2.0)  # let clocks and power settle between modes
                settle(candidates, len(sets), args.settle_s)
                start = time.time()
                timings = measure(candidates, n_sets=len(sets), rounds=args.rounds, round_ms=60)
                end = time.time()
                env = sampled(log, start, end)
                for name, t in timings.items():
                    row = {"problem": problem.describe(), "mode": mode, "call": name,
                           "tflops": problem.tflops(t.median_us),
                           "median_us": t.median_us, **env,
                           "tflops_per_ghz": problem.flops / t.median_us / 1e3
                           / env["sm_clock_mhz"]}
                    rows.append(row)
                    print(f"{row['problem']:30s} {mode:28s} {name:22s} {row['tflops']:6.1f} "
                          f"TFLOP/s  SM {env['sm_clock_mhz']:.0f} MHz  {env['power_w']:.0f} W  "
                          f"{row['tflops_per_ghz']:.0f} TFLOP/s per GHz", flush=True)
    finally:  # the whole pipeline: nvidia-smi outlives its shell otherwise and holds stdout
        os.killpg(smi.pid, signal.SIGTERM)
    Path(args.json).write_text(json.dumps({"gpu": torch.cuda.get_device_name(),
                                           "command": " ".join(["python", *sys.argv]),
                                           "settle_s": args.settle_s,
                                           "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
