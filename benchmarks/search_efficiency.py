"""How many trials each sampler needs to come within 2% of the exhaustive best, measured on the
recorded sweeps (benchmarks/sweep.py) through the real tuning loop on the replay backend.

    python benchmarks/search_efficiency.py --recording tests/data/sweep_sm80_h200.json \
        --json benchmarks/results/search_efficiency.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from autotune.cli import render_table
from autotune.model import load_space
from autotune.store import TuningStore
from autotune.tune import Progress, ReplayBackend, SearchSettings, tune_problem

# name -> search settings besides seed and budget. "tpe" is the default search; the others show
# what each part of it contributes.
VARIANTS: dict[str, dict[str, Any]] = {
    "tpe": {},
    "tpe-no-default-tile": {"seed_heuristic": False},
    "tpe-plain": {"seed_heuristic": False, "local_search": False},
    "random": {"sampler": "random", "seed_heuristic": False},
}


def trials_to_target(backend: ReplayBackend, problem: Any, sampler: str, seed: int,
                     budget: int, target_us: float, workdir: Path, family: str) -> int | None:
    store = TuningStore(f"sqlite:///{workdir}/{sampler}-{seed}-{abs(hash(problem))}.db")
    reached: list[int] = []

    def watch(p: Progress) -> None:
        if not reached and p.best_us is not None and p.best_us <= target_us:
            reached.append(p.evaluated)

    settings = {"sampler": "tpe", **VARIANTS[sampler]}
    tune_problem(problem, backend, store,
                 SearchSettings(seed=seed, trials=budget, warm_start=0, rerank_top=1, **settings),
                 families=[family], on_progress=watch)
    return reached[0] if reached else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recording", required=True)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--samplers", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--json", required=True)
    args = parser.parse_args()

    backend = ReplayBackend(Path(args.recording))
    (family,) = backend.families()
    space = load_space(family)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for problem in backend.problems:
            valid = len(space.valid_configs(backend.target(), problem.space_values()))
            recorded = backend.rows(problem, family)
            best = min(r["median_us"] for r in recorded if r.get("median_us"))
            for sampler in args.samplers:
                for seed in range(args.seeds):
                    n = trials_to_target(backend, problem, sampler, seed, valid // 4,
                                         best * 1.02, Path(tmp), family)
                    rows.append({"shape": problem.describe(), "problem": problem.as_dict(),
                                 "sampler": sampler, "valid_configs": valid, "seed": seed,
                                 "trials_to_within_2pct": n,
                                 "fraction_of_space": round(n / valid, 3) if n else None})
                    print(f"{problem.describe()} {sampler} seed {seed}: {n}/{valid}",
                          flush=True)
    summary = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        for sampler in args.samplers:
            ns = [r["trials_to_within_2pct"] for r in rows
                  if r["shape"] == shape and r["sampler"] == sampler]
            valid = next(r["valid_configs"] for r in rows if r["shape"] == shape)
            reached = [n for n in ns if n is not None]
            summary.append([shape, sampler, valid,
                            statistics.median(reached) if reached else "-",
                            max(reached) if reached else "-",
                            f"{len(reached)}/{len(ns)}"])
    print(render_table(["shape", "search", "valid", "median trials", "worst", "reached"],
                       summary))
    Path(args.json).write_text(json.dumps({"recording": args.recording,
                                           "command": " ".join(["python", *sys.argv]),
                                           "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
