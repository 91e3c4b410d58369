"""Kernel sources of two versions side by side: the same configs built from an older source tree
and from this one, checked against each other and timed call by call in one process.

A refactor of kernel_src/ must not cost speed: for every problem of a shape set this builds the
config the shipped database runs (db/h200.json; where SDPA won, the family's untuned default, so
every problem times a kernel), from the old tree (`git archive <commit> | tar -x -C DIR`) and from
this checkout, checks both outputs against the fp32 reference, and times old, new and SDPA's
default alternating call by call with the L2 flushed before each call (measure.timing).

    git archive <old-commit> | tar -x -C .oldtree
    python benchmarks/kernel_versions.py --old .oldtree --shapes llm-prefill --json out.json

The old tree's package is imported under another name (`autotune_old`) and only its build and
kernel stages are used, so the two launchers and cubin ABIs never meet.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from autotune.build import compile_many
from autotune.launch import CompiledKernel
from autotune.measure import measure, reference_attention, sdpa_call
from autotune.model import Config, Problem, default_target, load_shape_set, load_space
from autotune.store import TuningStore

ROOT = Path(__file__).resolve().parent.parent


def import_tree(tree: Path, name: str = "autotune_old") -> ModuleType:
    """The old tree's package as `name`. Its launcher extension gets a module name of its own
    (CPython keeps one extension module per name in a process): the tree is a scratch copy,
    and the launcher is not part of the kernels' source hash, so its cubins stay the same."""
    for path in (
        tree / "kernel_src" / "launcher" / "launcher.cpp",
        tree / "autotune" / "launcher.py",
    ):
        text = path.read_text()
        if "_cute_autotune_launcher_old" not in text:
            path.write_text(text.replace("_cute_autotune_launcher", "_cute_autotune_launcher_old"))
    # A link named `name` on sys.path: the compile pool's spawned workers import it too.
    links = Path(tempfile.mkdtemp(prefix="kernel_versions_"))
    (links / name).symlink_to((tree / "autotune").resolve(), target_is_directory=True)
    sys.path.insert(0, str(links))
    return importlib.import_module(name)


def configs_to_compare(problems: list[Problem], db: Path, family: str) -> list[Config]:
    store = TuningStore("sqlite://")
    store.import_results(json.loads(db.read_text()))
    space = load_space(family)
    chosen = []
    for problem in problems:
        best = store.best(None, problem)
        if best is not None and best.config.family == family:
            chosen.append(best.config)
        else:
            heuristic = space.heuristic(problem.space_values())
            assert heuristic is not None, problem.describe()
            chosen.append(heuristic)
    return chosen


def compare(problem: Problem, config: Config, new: Any, old: Any) -> dict[str, Any]:
    """Both kernels checked against the fp32 reference (NaN-poisoned outputs), then timed with
    SDPA's default in one alternation."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(0)
    dtype = torch.float16 if problem.dtype == "fp16" else torch.bfloat16

    def make(heads: int, length: int) -> torch.Tensor:
        shape = (problem.batch, heads, length, problem.head_dim)
        return torch.randn(shape, device="cuda", dtype=dtype, generator=gen)

    q = make(problem.heads_q, problem.seqlen_q)
    k, v = make(problem.heads_kv, problem.seqlen_k), make(problem.heads_kv, problem.seqlen_k)
    scale = 1 / math.sqrt(problem.head_dim)
    ref, _ = reference_attention(q, k, v, causal=problem.causal, scale=scale, layout="bhld")
    errors = {}
    kernels = {"new": new, "old": old}
    outs = {name: torch.full_like(q, float("nan")) for name in kernels}
    for name, kernel in kernels.items():
        kernel(q, k, v, out=outs[name])
        torch.cuda.synchronize()
        errors[name] = float((outs[name].float() - ref.float()).abs().max())
        assert math.isfinite(errors[name]) and errors[name] < 5e-2, (name, errors[name])
    sdpa = sdpa_call("default", q, k, v, causal=problem.causal, scale=None, layout="bhld")
    timings = measure(
        {
            "new": lambda _i: new(q, k, v, out=outs["new"]),
            "old": lambda _i: old(q, k, v, out=outs["old"]),
            "sdpa_default": lambda _i: sdpa(),
        }
    )
    return {
        "shape": problem.describe(),
        "problem": problem.as_dict(),
        "config": config.as_dict(),
        "name": load_space(config.family).name_of(config),
        "max_abs_error": errors,
        **{
            n: {
                "median_us": t.median_us,
                "p20_us": t.p20_us,
                "p80_us": t.p80_us,
                "tflops": problem.tflops(t.median_us),
            }
            for n, t in timings.items()
        },
        "new_over_old": timings["old"].median_us / timings["new"].median_us,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True, help="the old source tree")
    parser.add_argument("--shapes", default="llm-prefill")
    parser.add_argument("--family", default="sm90")
    parser.add_argument("--db", type=Path, default=ROOT / "db" / "h200.json")
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    problems = load_shape_set(args.shapes)[: args.limit]
    configs = configs_to_compare(problems, args.db, args.family)
    target = default_target()
    start = time.monotonic()
    new_builds = compile_many(configs, target, jobs=args.jobs)
    old = import_tree(args.old)
    old_compiler = importlib.import_module("autotune_old.compiler")
    old_config = importlib.import_module("autotune_old.config")
    old_kernel = importlib.import_module("autotune_old.kernel")
    old_builds = old_compiler.compile_many(
        [old_config.Config.from_dict(c.as_dict()) for c in configs],
        old.target_for_arch(f"sm_{target.cc}"),
        jobs=args.jobs,
    )
    print(f"built {len(configs)} configs twice in {time.monotonic() - start:.0f} s", flush=True)

    rows = []
    for problem, config, new_build, old_build in zip(
        problems, configs, new_builds, old_builds, strict=True
    ):
        assert new_build.ok and old_build.ok, (new_build.message, old_build.message)
        row = compare(
            problem, config, CompiledKernel(new_build), old_kernel.CompiledKernel(old_build)
        )
        rows.append(row)
        print(
            f"{problem.describe():44s} old {row['old']['median_us']:8.1f} us  new "
            f"{row['new']['median_us']:8.1f} us  new/old {row['new_over_old']:.3f}  "
            f"sdpa {row['sdpa_default']['median_us']:8.1f} us",
            flush=True,
        )

    ratios = [r["new_over_old"] for r in rows]
    summary = {
        "shapes": args.shapes,
        "family": args.family,
        "problems": len(rows),
        "geomean_new_over_old": math.exp(statistics.fmean(math.log(x) for x in ratios)),
        "worst_new_over_old": min(ratios),
        "best_new_over_old": max(ratios),
        "regime": "flushed-alternating-1 (old, new, SDPA default)",
        "command": " ".join(["python", *sys.argv]),
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
