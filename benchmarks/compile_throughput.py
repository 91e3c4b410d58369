"""Compile throughput (configs per minute) and the cost of a cache hit.

Compiles a seeded random sample of valid sm80 configs into a fresh cache with all cores, then
times cache hits: in this process (warm) and in fresh processes (what a new `cute-autotune` run
pays: the toolchain memo and source hash are read again, the imports are not counted).

    python benchmarks/compile_throughput.py --configs 32 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autotune.build import ArtifactCache, compile_config, compile_many, default_jobs
from autotune.build import current_toolchain as toolchain
from autotune.model import load_space, target_for_arch

FRESH_PROCESS_PROBE = """
import sys, time
from autotune.build import compile_config
from autotune.model import Config
from autotune.model import target_for_arch
config, target = Config.from_json(sys.argv[1]), target_for_arch("sm_90")
start = time.perf_counter()
result = compile_config(config, target)
print((time.perf_counter() - start) * 1e3, result.cached)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()

    target = target_for_arch("sm_90")
    space = load_space("sm80")
    pool = [c for d in (64, 128) for c in space.valid_configs(target, {"head_dim": d})]
    configs = random.Random(args.seed).sample(pool, args.configs)
    jobs = args.jobs or default_jobs()
    with tempfile.TemporaryDirectory(prefix="compile-bench-") as tmp:
        os.environ["CUTE_AUTOTUNE_CACHE"] = tmp
        cache = ArtifactCache(Path(tmp))
        toolchain()  # nvcc --version once, outside the timed region
        start = time.perf_counter()
        results = compile_many(configs, target, jobs=jobs, cache=cache)
        wall = time.perf_counter() - start
        ok = [r for r in results if r.ok]
        warm = []
        for config in configs:
            t0 = time.perf_counter()
            hit = compile_config(config, target, cache)
            warm.append((time.perf_counter() - t0) * 1e3)
            assert hit.cached
        fresh = []
        for config in configs[:8]:
            out = subprocess.run([sys.executable, "-c", FRESH_PROCESS_PROBE, config.to_json()],
                                 capture_output=True, text=True, check=True, env=os.environ)
            ms, cached = out.stdout.split()
            assert cached == "True"
            fresh.append(float(ms))
    payload = {
        "host": platform.node(), "cores": os.cpu_count(), "jobs": jobs,
        "nvcc": toolchain().nvcc_version, "configs": len(configs), "compiled_ok": len(ok),
        "wall_seconds": round(wall, 2), "configs_per_minute": round(60 * len(ok) / wall, 2),
        "nvcc_seconds_median": round(statistics.median(r.seconds for r in ok), 2),
        "cache_hit_ms_warm_median": round(statistics.median(warm), 3),
        "cache_hit_ms_warm_max": round(max(warm), 3),
        "cache_hit_ms_fresh_process_median": round(statistics.median(fresh), 3),
        "cache_hit_ms_fresh_process_max": round(max(fresh), 3),
        "command": " ".join(["python", *sys.argv]),
    }
    Path(args.json).write_text(json.dumps(payload, indent=1))
    print(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
