"""Issue 38, item 4: a new problem tuned in a minute. Problems drawn by a seed (half prefill,
half decode, D=256 and fp16 among them; benchmarks/generalization.py's draw), each tuned by
`cute-autotune tune --quick` in a fresh process with an empty cubin cache and a fresh database
(the launcher extension, built once per machine, is built before and shared), its wall time
taken from the process start to its end (CUDA start, compiles, timing, the re-ranking against
SDPA). With `--reference-trials N`, each problem is then searched again with
the plain search (`tune --trials N`, TPE, its own database) and the two winners are timed
together in the plain alternating check: quick over reference is the quick search's regret.

    python benchmarks/quick_tune.py --seed 5 --json OUT.json [--count 8] \\
        [--reference-trials 40] [--stop-after 480]

Rows already in --json are kept (it resumes); the kernel pack is not used unless
$CUTE_AUTOTUNE_KERNELS names one (the row says which).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from generalization import Drawn, _best_callables, draw  # noqa: E402


def chosen(seed: int, count: int) -> list[Drawn]:
    """`count` problems of the seed's draw: half prefill, half decode, the first drawn of each
    kind, with one at D=256 and one in fp16 at least (the first such drawn takes the last
    place of its kind when the first picks lack it)."""
    pool = draw(seed, 20 * count)
    half = count // 2
    picked = [d for d in pool if d.kind == "prefill"][:half] + [
        d for d in pool if d.kind == "decode"
    ][: count - half]
    for wanted in (lambda d: d.problem.head_dim == 256, lambda d: d.problem.dtype == "fp16"):
        if not any(wanted(d) for d in picked):
            extra = next(d for d in pool if wanted(d) and d not in picked)
            same = [i for i, d in enumerate(picked) if d.kind == extra.kind]
            picked[same[-1]] = extra
    return picked


def problem_args(problem: Any) -> list[str]:
    return [
        "--batch",
        str(problem.batch),
        "--heads-q",
        str(problem.heads_q),
        "--heads-kv",
        str(problem.heads_kv),
        "--seqlen-q",
        str(problem.seqlen_q),
        "--seqlen-k",
        str(problem.seqlen_k),
        "--head-dim",
        str(problem.head_dim),
        "--dtype",
        problem.dtype,
        "--causal",
        str(problem.causal).lower(),
    ]


def timed_tune(problem: Any, db: str, extra: list[str], cache: str) -> dict[str, Any]:
    """One `cute-autotune tune` process: its wall time and its outcome (--json)."""
    out = Path(tempfile.mkdtemp()) / "tune.json"
    command = [
        sys.executable,
        "-m",
        "autotune.cli",
        "tune",
        "--db",
        db,
        "--quiet",
        "--json",
        str(out),
        *problem_args(problem),
        *extra,
    ]
    env = {**os.environ, "CUTE_AUTOTUNE_CACHE": cache}
    start = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    outcome = json.loads(out.read_text())[0] if out.exists() else None
    return {
        "command": " ".join(command[2:]),
        "wall_s": round(wall, 1),
        "rc": done.returncode,
        "outcome": outcome,
        "stderr_tail": done.stderr[-1500:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--json", required=True, help="rows (kept and resumed)")
    parser.add_argument(
        "--reference-trials",
        type=int,
        default=0,
        help="trials per family of the plain search to compare with (0: none)",
    )
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument(
        "--perf-model", help="passed to `tune --quick` (default: the shipped model of the GPU)"
    )
    parser.add_argument("--stop-after", type=float, default=480)
    args = parser.parse_args()
    out = Path(args.json)
    doc = json.loads(out.read_text()) if out.exists() else {"seed": args.seed, "rows": []}
    done = {row["index"] for row in doc["rows"]}
    work = Path(tempfile.mkdtemp(prefix="quick-tune-"))
    base = work / "cache-base"
    subprocess.run(
        [sys.executable, "-c", "from autotune.launch import launcher_path; launcher_path()"],
        env={**os.environ, "CUTE_AUTOTUNE_CACHE": str(base)},
        check=True,
    )
    started = time.monotonic()
    for d in chosen(args.seed, args.count):
        if d.index in done:
            continue
        if time.monotonic() - started > args.stop_after:
            print(f"stopped after {args.stop_after} s: run again to resume", flush=True)
            break
        quick_db = f"sqlite:///{work}/quick-{d.index}.db"
        cache = work / f"cache-{d.index}"  # no cubin; the launcher built above
        cache.mkdir()
        (cache / "launcher").symlink_to(base / "launcher")
        row: dict[str, Any] = {
            **d.row(),
            "shape": d.problem.describe(),
            "kernel_pack": os.environ.get("CUTE_AUTOTUNE_KERNELS"),
            "quick": timed_tune(
                d.problem,
                quick_db,
                ["--quick", *(["--perf-model", args.perf_model] if args.perf_model else [])],
                str(cache),
            ),
        }
        print(
            f"{d.index:3d} {d.kind:<7} {d.problem.describe():<40} quick "
            f"{row['quick']['wall_s']:6.1f} s rc {row['quick']['rc']}",
            flush=True,
        )
        if args.reference_trials:
            ref_db = f"sqlite:///{work}/ref-{d.index}.db"
            row["reference"] = timed_tune(
                d.problem, ref_db, ["--trials", str(args.reference_trials)], str(cache)
            )
            row.update(_together(d, quick_db, ref_db, args.calls))
            print(
                f"    reference {row['reference']['wall_s']:6.1f} s; quick over reference "
                f"{row.get('quick_over_reference', float('nan')):.3f}",
                flush=True,
            )
        doc["rows"].append(row)
        out.write_text(json.dumps(doc, indent=1) + "\n")
    doc["command"] = " ".join(sys.argv)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def _together(d: Drawn, quick_db: str, ref_db: str, calls: int) -> dict[str, Any]:
    """Both winners in one alternation (the plain check): their medians and the ratio."""
    from alternating_check import alternating

    quick, quick_config = _best_callables(d.problem, quick_db, d.layout)
    ref, ref_config = _best_callables(d.problem, ref_db, d.layout)
    if quick is None or ref is None:
        return {"quick_over_reference": None}

    def both(q: Any, k: Any, v: Any) -> dict[str, Any]:
        return {"quick": quick(q, k, v)["best"], "reference": ref(q, k, v)["best"]}

    row = alternating(d.problem, calls=calls, layout=d.layout, extra=both)
    times = row["median_us"]
    return {
        "quick_config": quick_config,
        "reference_config": ref_config,
        "together_us": times,
        "quick_over_reference": times["quick"] / times["reference"],
    }


if __name__ == "__main__":
    sys.exit(main())
