"""`cute-autotune demo`, the main job end to end.

Everywhere: the static analysis of every kernel family the target runs (valid configs of the
problem class) and a build of each family's untuned default, with its ptxas report. On a GPU,
then: a short tuning session of one problem over every family the GPU runs (into the tuning
database), the best config read back from the database, and `attention()` dispatching to it,
timed against torch SDPA in the same run and checked against it.
"""

from __future__ import annotations

import sys
from typing import Any

from ..build.compiler import compile_many, default_jobs
from ..model.problem import Problem
from ..model.space import load_space, supported_families
from ..model.target import Target, default_target
from ..store.schema import default_url
from .build_table import build_table
from .table import render_table


def static_part(problem: Problem, target: Target) -> bool:
    """Valid-config counts per family and a build of each family's default; False if a build
    failed."""
    counts, defaults = [], []
    for family in supported_families(target):
        space = load_space(family)
        if not space.serves(problem.seqlen_q):
            continue
        values = problem.space_values()
        total = sum(1 for _ in space.all_configs(values))
        counts.append([family, len(space.valid_configs(target, values)), total, space.description])
        default = space.heuristic(values)
        if default is not None and space.is_valid(default, target):
            defaults.append(default)
    print(f"static analysis of {problem.describe()} on {target.name}:")
    print(render_table(["family", "valid", "of", "kernel"], counts))
    print(f"\nbuilding each family's untuned default ({default_jobs()} nvcc jobs) ...")
    results = compile_many(defaults, target)
    print(build_table(results))
    return all(r.ok for r in results)


def gpu_part(problem: Problem, trials: int, db: str | None) -> int:
    import torch
    import torch.nn.functional as F

    from ..measure.timing import measure
    from ..runtime.attention import attention, configure, explain
    from ..tune.search import SearchSettings
    from ..tune.tuning import best_config, tune
    from .tuning import outcome_rows

    url = db or default_url()
    print(
        f"\ntuning {problem.describe()} on {torch.cuda.get_device_name()}: {trials} trials per "
        f"kernel family, then the top 3 of each re-timed together (database {url})"
    )
    settings = SearchSettings(trials=trials, batch_size=trials, rerank_top=3)
    outcome = tune(problem, db=url, settings=settings)[0]
    print(
        render_table(
            [
                "problem",
                "family",
                "best config",
                "TFLOP/s",
                "vs SDPA",
                "vs FLASH",
                "this session",
                "trials",
            ],
            outcome_rows(outcome, marked=len(outcome.families) > 1),
        )
    )
    answer = best_config(problem, db=url)
    if answer is None:
        print(
            "\nno config of any family passed validation and timing; attention() falls back "
            "to torch SDPA",
            file=sys.stderr,
        )
        return 1
    record = answer.record
    print(
        f"\nbest config in the database ({answer.match}): "
        f"{load_space(record.config.family).name_of(record.config)}, {record.tflops:.1f} "
        f"TFLOP/s"
        + (f", {record.speedup_vs_default:.2f}x SDPA default" if record.speedup_vs_default else "")
    )

    configure(db=url)
    shape = (problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3))
    decision = explain(q, k, v, causal=problem.causal)
    out = attention(q, k, v, causal=problem.causal)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=problem.causal)
    err = float((out.float() - expected.float()).norm() / expected.float().norm())
    fns: dict[str, Any] = {
        "autotune.attention": lambda i: attention(q, k, v, causal=problem.causal),
        "torch sdpa (default)": lambda i: F.scaled_dot_product_attention(
            q, k, v, is_causal=problem.causal
        ),
    }
    timings = measure(fns, rounds=5, round_ms=30)
    print(
        f"\nautotune.attention(q, k, v{', causal=True' if problem.causal else ''}) dispatches "
        f"on the {decision.path} path: {decision.reason}"
    )
    print(
        render_table(
            ["call", "median us", "TFLOP/s"],
            [
                [n, f"{t.median_us:.1f}", f"{problem.tflops(t.median_us):.1f}"]
                for n, t in sorted(timings.items(), key=lambda kv: kv[1].median_us)
            ],
        )
    )
    print(f"relative difference to SDPA: {err:.2e}")
    return 0 if err < 1e-2 else 1


def run(head_dim: int, causal: bool, trials: int, db: str | None, gpu: bool) -> int:
    problem = Problem(4, 16, 16, 2048, 2048, head_dim, "fp16", causal)
    target = default_target()
    if not gpu:
        print(
            "No CUDA GPU is visible here: running the compile-and-static-analysis part only "
            "(cubins for sm_90; tuning, validation and timing need a GPU).\n"
        )
    built = static_part(problem, target)
    if not gpu:
        return 0 if built else 1
    return gpu_part(problem, trials, db)
