"""How many trials each sampler needs to come within 2% of the exhaustive best, measured on the
recorded sweeps (benchmarks/sweep.py) through the real tuning loop on the replay backend, and
how close the best found within the budget comes (a quarter of the valid configs, or
--budget: e.g. the 8 trials a decode-tuning problem gets). Beside each problem, two references
drawn from the recording itself (500 draws of the budget, medians): that many configs at
random, and that many builds at random with every value of the launch parameters timed on each
(what a search that sweeps a build's KV split counts would see).

    python benchmarks/search_efficiency.py --recording tests/data/sweep_sm80_h200.json \
        --json benchmarks/results/search_efficiency.json
"""

from __future__ import annotations

import argparse
import json
import random
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
    # `tune --quick`: the performance model, fitted on the recording without the problem
    # searched (leave one problem out), ranks the builds; no warm start from other problems.
    "model": {"sampler": "model", "prebuild": 12, "batch_size": 2},
}


def trials_to_target(
    backend: ReplayBackend,
    problem: Any,
    sampler: str,
    seed: int,
    budget: int,
    target_us: float,
    workdir: Path,
    family: str,
) -> tuple[int | None, float | None]:
    """Trials until the search's best came within `target_us` (None: not within the budget),
    and the best it found in the budget."""
    store = TuningStore(f"sqlite:///{workdir}/{sampler}-{seed}-{abs(hash(problem))}.db")
    reached: list[int] = []
    best: list[float] = []

    def watch(p: Progress) -> None:
        if p.best_us is not None:
            best[:] = [p.best_us]
        if not reached and p.best_us is not None and p.best_us <= target_us:
            reached.append(p.evaluated)

    settings = {"sampler": "tpe", **VARIANTS[sampler]}
    if sampler == "model":
        settings["perf_model"] = str(_model_without(backend, problem, workdir))
        budget = min(budget, 6)  # what --quick times at most per family
    tune_problem(
        problem,
        backend,
        store,
        SearchSettings(seed=seed, trials=budget, warm_start=0, rerank_top=1, **settings),
        families=[family],
        on_progress=watch,
    )
    return (reached[0] if reached else None), (best[0] if best else None)


def _model_without(backend: ReplayBackend, problem: Any, workdir: Path) -> Path:
    """The performance model of the recordings' other problems (fitted once per problem)."""
    from autotune.tune import fit_perf_model, timings_of_recording

    path = workdir / f"model-without-{abs(hash(problem))}.json"
    if not path.exists():
        data = [
            t
            for recording in backend.recordings
            for t in timings_of_recording(recording)
            if t.problem != problem
        ]
        path.write_text(json.dumps(fit_perf_model(data, backend.device().name, trees=60)))
    return path


def references(
    rows: list[dict[str, Any]], budget: int, best: float, launch: list[str], draws: int = 500
) -> tuple[float, float]:
    """Median best/exhaustive-best of `budget` recorded configs drawn at random, and of
    `budget` builds drawn at random with all their launch-parameter values."""
    rng = random.Random(0)
    timed = [r for r in rows if r.get("median_us")]
    by_build: dict[str, float] = {}
    for r in timed:
        key = json.dumps({k: v for k, v in r["config"].items() if k not in launch}, sort_keys=True)
        by_build[key] = min(by_build.get(key, float("inf")), r["median_us"])
    builds = list(by_build.values())
    configs = [r["median_us"] for r in timed]
    pick = [min(rng.sample(configs, min(budget, len(configs)))) / best for _ in range(draws)]
    swept = [min(rng.sample(builds, min(budget, len(builds)))) / best for _ in range(draws)]
    return statistics.median(pick), statistics.median(swept)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recording", required=True)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--samplers", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument(
        "--budget", type=int, help="trials per search (default: a quarter of the valid configs)"
    )
    parser.add_argument("--json", required=True)
    args = parser.parse_args()

    backend = ReplayBackend(Path(args.recording))
    (family,) = backend.families()
    space = load_space(family)
    rows: list[dict[str, Any]] = []
    refs: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for problem in backend.problems:
            valid = len(space.valid_configs(backend.target(), problem.space_values()))
            recorded = backend.rows(problem, family)
            best = min(r["median_us"] for r in recorded if r.get("median_us"))
            budget = args.budget or valid // 4
            at_random, builds_swept = references(
                recorded, budget, best, [p.name for p in space.launch_params]
            )
            refs[problem.describe()] = {
                "random_configs_over_best": round(at_random, 4),
                "random_builds_all_launch_values_over_best": round(builds_swept, 4),
            }
            for sampler in args.samplers:
                for seed in range(args.seeds):
                    n, found = trials_to_target(
                        backend, problem, sampler, seed, budget, best * 1.02, Path(tmp), family
                    )
                    rows.append(
                        {
                            "shape": problem.describe(),
                            "problem": problem.as_dict(),
                            "sampler": sampler,
                            "valid_configs": valid,
                            "seed": seed,
                            "trials_to_within_2pct": n,
                            "fraction_of_space": round(n / valid, 3) if n else None,
                            "found_over_best": round(found / best, 4) if found else None,
                        }
                    )
                    print(
                        f"{problem.describe()} {sampler} seed {seed}: {n}/{valid}, found "
                        f"{found} against {best}",
                        flush=True,
                    )
    summary = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        for sampler in args.samplers:
            ns = [
                r["trials_to_within_2pct"]
                for r in rows
                if r["shape"] == shape and r["sampler"] == sampler
            ]
            valid = next(r["valid_configs"] for r in rows if r["shape"] == shape)
            reached = [n for n in ns if n is not None]
            ratios = [
                r["found_over_best"]
                for r in rows
                if r["shape"] == shape and r["sampler"] == sampler and r["found_over_best"]
            ]
            summary.append(
                [
                    shape,
                    sampler,
                    valid,
                    statistics.median(reached) if reached else "-",
                    max(reached) if reached else "-",
                    f"{len(reached)}/{len(ns)}",
                    f"{statistics.median(ratios):.3f}" if ratios else "-",
                    f"{refs[shape]['random_configs_over_best']:.3f}",
                    f"{refs[shape]['random_builds_all_launch_values_over_best']:.3f}",
                ]
            )
    print(
        render_table(
            [
                "shape",
                "search",
                "valid",
                "median trials",
                "worst",
                "reached",
                "found/best",
                "random",
                "builds swept",
            ],
            summary,
        )
    )
    Path(args.json).write_text(
        json.dumps(
            {
                "recording": args.recording,
                "budget": args.budget,
                "references": refs,
                "command": " ".join(["python", *sys.argv]),
                "rows": rows,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
