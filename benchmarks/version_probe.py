"""Two versions of a kernel family side by side, in one process, against torch SDPA.

A kernel change invalidates every cubin (the cache key covers the sources), so comparing
versions across device sessions would compare power states and clocks as much as code. This
loads the previous version's cubins from a carried cache (located by that version's source
hash), builds the current version, checks both outputs against SDPA, and times the two and
SDPA's default interleaved round by round (autotune.measure.timing.measure).

    python benchmarks/version_probe.py --old-cache .cubins90v2 --old-hash 1a06afeeaf2cd3a3 \\
        --results db/h200.json --max-seqlen 1024 --json out.json

The old hash is `kernel_source_hash('sm90')` of the old checkout (autotune/toolchain.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from autotune.build import NVCC_FLAGS, artifact_key, compile_config
from autotune.build import current_toolchain as toolchain
from autotune.launch import CompiledKernel
from autotune.measure import measure, problem_inputs, reference_attention, sdpa_call
from autotune.model import Config, Problem, Target, default_target, load_space


def old_kernel(config: Config, cache: Path, old_hash: str, target: Target) -> CompiledKernel:
    """The previous version's cubin of `config`, loaded as a kernel."""
    space = load_space(config.family)
    key = artifact_key(config, space.gencode_for(target), old_hash, toolchain(), NVCC_FLAGS)
    cubin = cache / "cubins" / config.family / key / "kernel.cubin"
    if not cubin.is_file():
        raise FileNotFoundError(f"no old cubin for {space.name_of(config)} at {cubin}")
    build = compile_config(config, target)  # the current build's record, the old cubin
    return CompiledKernel(dataclasses.replace(build, cubin=cubin))


def probe(problem: Problem, config: Config, args: argparse.Namespace, target: Target
          ) -> dict[str, Any]:
    new = CompiledKernel(compile_config(config, target))
    old = old_kernel(config, args.old_cache, args.old_hash, target)
    sets = problem_inputs(problem)
    q, k, v, _ = sets[0]
    ref, _ = reference_attention(q, k, v, causal=problem.causal,
                                 scale=1.0 / math.sqrt(problem.head_dim))
    errors = {}
    for name, kernel in (("old", old), ("new", new)):
        out = torch.full_like(q, float("nan"))
        kernel(q, k, v, out=out)
        torch.cuda.synchronize()
        errors[name] = float((out.float() - ref).abs().max())
    sdpa = [sdpa_call("default", *s[:3], causal=problem.causal) for s in sets]
    candidates = {
        "old": lambda i: old(*sets[i][:3], out=sets[i][3]),
        "new": lambda i: new(*sets[i][:3], out=sets[i][3]),
        "sdpa": lambda i: sdpa[i](),
    }
    timings = measure(candidates, n_sets=len(sets), rounds=args.rounds)
    row: dict[str, Any] = {"problem": problem.as_dict(), "config": config.as_dict(),
                           "max_abs_error": errors}
    for name, t in timings.items():
        row[name] = {"median_us": t.median_us, "tflops": problem.tflops(t.median_us)}
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-cache", type=Path, required=True)
    ap.add_argument("--old-hash", required=True)
    ap.add_argument("--results", type=Path, default=Path("db/h200.json"),
                    help="exported results: each problem's best config is probed")
    ap.add_argument("--max-seqlen", type=int, default=1 << 30)
    ap.add_argument("--min-seqlen", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--stop-after", type=float, default=1e9, help="seconds")
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    target = default_target()
    rows = []
    start = time.monotonic()
    results = json.loads(args.results.read_text())["results"]
    for r in results:
        problem = Problem(**r["problem"])
        if not args.min_seqlen <= problem.seqlen_q <= args.max_seqlen:
            continue
        if time.monotonic() - start > args.stop_after:
            print("stopped: --stop-after", file=sys.stderr)
            break
        row = probe(problem, Config.from_dict(r["config"]), args, target)
        rows.append(row)
        p = problem
        print(f"{p.batch:>2} {p.heads_q:>2}/{p.heads_kv:<2} L{p.seqlen_q:>5} D{p.head_dim:>3} "
              f"{p.dtype} {'causal' if p.causal else 'full  '}  old {row['old']['tflops']:6.1f}"
              f"  new {row['new']['tflops']:6.1f}  sdpa {row['sdpa']['tflops']:6.1f}  "
              f"new/old {row['new']['tflops'] / row['old']['tflops']:5.3f}  "
              f"new/sdpa {row['new']['tflops'] / row['sdpa']['tflops']:5.3f}  "
              f"err {row['max_abs_error']['old']:.1e}/{row['max_abs_error']['new']:.1e}",
              flush=True)
    geo = {key: math.exp(sum(math.log(x["new"]["tflops"] / x[key]["tflops"]) for x in rows)
                         / max(1, len(rows))) for key in ("old", "sdpa")}
    args.json.write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows,
                                     "geomean_new_vs_old": geo["old"],
                                     "geomean_new_vs_sdpa": geo["sdpa"]}, indent=1))
    print(f"geomean new/old {geo['old']:.3f}  new/sdpa {geo['sdpa']:.3f}  ({len(rows)} problems)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
