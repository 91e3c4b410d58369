"""Issue 38's generalization benchmark: problems nobody tuned, drawn at run time from real model
configs by a seed, each timed as a new user meets it: `attention()` reading only the shipped
`db/` results (an empty tuning database otherwise) against SDPA's default, and against the best
config a full search of every family finds (written to a scratch database), in one alternation.

    python benchmarks/generalization.py draw --seed 7 [--count 60] [--model M.json]
    python benchmarks/generalization.py search --seed 7 --scratch-db sqlite:///s.db \\
        [--exhaustive 16] [--budget 160] [--stop-after 480] [--dry-run]
    python benchmarks/generalization.py measure --seed 7 --scratch-db sqlite:///s.db \\
        --json OUT.json [--calls 40] [--stop-after 480]
    python benchmarks/generalization.py report --json OUT.json [OUT2.json ...]

`draw` lists the problems (no GPU). It fails when a drawn problem is one the shipped results or
the performance model (`--model`, else every `db/*.model.json`) were fitted on. `search` tunes
the drawn problems into the scratch database with `cute-autotune tune`: the grid over every valid
config of every family on `--exhaustive` of them (drawn by the seed, spread over prefill and
decode, head dims and dtypes), `--budget` trials per family on the rest, torch SDPA's backends
among every re-ranking's finalists; it stops starting problems after `--stop-after` seconds and
resumes where it stopped (`--skip-tuned`), so it may span several GPU calls with the scratch
database carried. `measure` times each problem (and, for fp16 decode with GQA, its bf16 twin)
in the plain alternating check (benchmarks/alternating_check.py); rows already in `--json` are
kept, so it resumes too. `report` judges the rows (no GPU): the floor (untuned dispatch never
below 0.98x of SDPA's default, a row holding when its speed-up's p80 reaches it), regret
(untuned dispatch over the fastest of the search's best and SDPA's backends) by search group,
and fp16 decode with GQA against SDPA and its bf16 twin.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parents[1]

# (model, query heads, key/value heads, head dim): attention as each model's layers run it.
MODELS = (
    ("Llama-3-8B", 32, 8, 128),
    ("Llama-3-70B", 64, 8, 128),
    ("Mistral-7B", 32, 8, 128),
    ("Qwen2.5-7B", 28, 4, 128),  # GQA 7
    ("Qwen2.5-14B", 40, 8, 128),  # GQA 5
    ("Qwen2.5-0.5B", 14, 2, 64),  # GQA 7, D=64
    ("Gemma-2-9B", 16, 8, 256),
    ("Gemma-2-2B", 8, 4, 256),
    ("Phi-3-mini", 32, 32, 96),
    ("Phi-3-medium", 40, 10, 128),
    ("Falcon-7B", 71, 1, 64),  # MQA
    ("StarCoder-15B", 48, 1, 128),  # MQA
)
MIN_LENGTH, MAX_LENGTH = 100, 32768
MAX_BATCH = 32
MAX_PREFILL_TOKENS = 65536  # B x L of a prefill row: each call stays within milliseconds
MAX_KV_BYTES = 4 << 30  # K and V of a decode row
FLOOR = 0.98
REGRET_GEOMEAN, REGRET_WORST = 1.03, 1.10
FP16_DECODE_GEOMEAN, TWIN_TOLERANCE = 3.0, 0.10


@dataclass(frozen=True)
class Drawn:
    index: int
    model: str
    kind: str  # "prefill" or "decode"
    layout: str
    problem: Any  # autotune.model.Problem

    def row(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "model": self.model,
            "kind": self.kind,
            "layout": self.layout,
            "problem": self.problem.as_dict(),
        }


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def _odd_length(rng: random.Random, low: int, high: int) -> int:
    return min(high - 1, int(_log_uniform(rng, low, high))) | 1


def draw(seed: int, count: int) -> list[Drawn]:
    """`count` problems, half prefill and half decode, from `seed` alone (the same list on any
    machine): a model of MODELS, log-uniform odd lengths of 100-32k, a log-uniform batch of
    1-32 (fewer where the row would outgrow its bound), fp16 or bf16, either layout."""
    from autotune.model import Problem

    rng = random.Random(seed)
    drawn: list[Drawn] = []
    while len(drawn) < count:
        model, heads_q, heads_kv, head_dim = rng.choice(MODELS)
        kind = "decode" if len(drawn) % 2 else "prefill"
        dtype, layout = rng.choice(("fp16", "bf16")), rng.choice(("bhld", "blhd"))
        seqlen_k = _odd_length(rng, MIN_LENGTH, MAX_LENGTH)
        batch = max(1, round(_log_uniform(rng, 1, MAX_BATCH)))
        if kind == "decode":
            seqlen_q = max(1, round(_log_uniform(rng, 1, 16)))
            causal = True
            per_sequence = 2 * 2 * heads_kv * seqlen_k * head_dim  # K and V, 2-byte types
            batch = max(1, min(batch, MAX_KV_BYTES // per_sequence))
        else:
            # Mostly whole prompts; a chunked prefill (fewer queries than keys) now and then.
            seqlen_q = (
                seqlen_k if rng.random() < 0.7 else _odd_length(rng, MIN_LENGTH, seqlen_k + 1)
            )
            causal = rng.random() < 0.8
            batch = max(1, min(batch, MAX_PREFILL_TOKENS // seqlen_k))
        problem = Problem(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype, causal)
        if any(d.problem == problem for d in drawn):
            continue
        drawn.append(Drawn(len(drawn), model, kind, layout, problem))
    return drawn


def exhaustive_group(drawn: list[Drawn], size: int, seed: int) -> list[int]:
    """Indices of `size` problems for the exhaustive search, by the seed: one of each (kind,
    head dim, dtype) in turn, so the group spans prefill and decode, head dims and dtypes."""
    rng = random.Random(seed ^ 0x5EED)
    groups: dict[tuple[str, int, str], list[int]] = {}
    for d in drawn:
        groups.setdefault((d.kind, d.problem.head_dim, d.problem.dtype), []).append(d.index)
    for members in groups.values():
        rng.shuffle(members)
    order = sorted(groups)
    rng.shuffle(order)
    chosen: list[int] = []
    while len(chosen) < min(size, len(drawn)):
        for key in order:
            if groups[key] and len(chosen) < size:
                chosen.append(groups[key].pop())
    return sorted(chosen)


def fitted_problems(model_paths: list[str]) -> dict[Any, str]:
    """Problem -> what was fitted or tuned on it: the shipped results, and each model file."""
    from autotune.model import PerfModel, Problem
    from autotune.runtime import shipped_results

    seen: dict[Any, str] = {}
    for doc in shipped_results():
        for entry in doc.get("results", []):
            try:
                seen[Problem(**entry["problem"])] = "the shipped db/ results"
            except (KeyError, TypeError, ValueError):
                continue
    for path in model_paths:
        model = PerfModel(json.loads(Path(path).read_text()))
        for problem in model.fit_problems:
            seen[problem] = f"the fit of {path}"
    return seen


def model_files(given: list[str] | None) -> list[str]:
    return (
        given if given is not None else sorted(str(p) for p in (ROOT / "db").glob("*.model.json"))
    )


def checked_draw(args: argparse.Namespace) -> list[Drawn]:
    """The drawn problems, or SystemExit naming those the fit data holds."""
    drawn = draw(args.seed, args.count)
    seen = fitted_problems(model_files(args.model))
    clashes = [
        f"  {d.problem.describe()}: in {seen[d.problem]}" for d in drawn if d.problem in seen
    ]
    if clashes:
        raise SystemExit(
            f"seed {args.seed} drew problems the tuning or the model's fit "
            "saw: this would not measure generalization\n" + "\n".join(clashes)
        )
    return drawn


def cmd_draw(args: argparse.Namespace) -> int:
    drawn = checked_draw(args)
    group = set(exhaustive_group(drawn, args.exhaustive, args.seed))
    for d in drawn:
        search = "exhaustive" if d.index in group else "budget"
        print(
            f"{d.index:3d} {d.model:<14} {d.kind:<8} {d.layout} {search:<10} "
            f"{d.problem.describe()}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "seed": args.seed,
                    "problems": [
                        {**d.row(), "search": "exhaustive" if d.index in group else "budget"}
                        for d in drawn
                    ],
                },
                indent=1,
            )
            + "\n"
        )
    return 0


def _shape_file(problems: list[Any], path: Path) -> None:
    lines = ['name = "generalization"', "shapes = ["]
    for p in problems:
        lines.append(
            f"  {{ batch = {p.batch}, heads_q = {p.heads_q}, heads_kv = {p.heads_kv}, "
            f"seqlen_q = {p.seqlen_q}, seqlen_k = {p.seqlen_k}, head_dim = {p.head_dim}, "
            f'dtype = "{p.dtype}", causal = {str(p.causal).lower()} }},'
        )
    lines.append("]")
    path.write_text("\n".join(lines) + "\n")


def search_commands(drawn: list[Drawn], args: argparse.Namespace, folder: Path) -> list[list[str]]:
    """The `cute-autotune tune` runs of the search: the exhaustive group, then the rest."""
    group = set(exhaustive_group(drawn, args.exhaustive, args.seed))
    base = [
        sys.executable,
        "-m",
        "autotune.cli",
        "tune",
        "--db",
        args.scratch_db,
        "--skip-tuned",
        "--quiet",
    ]
    runs = []
    for name, members, extra in (
        (
            "exhaustive",
            [d for d in drawn if d.index in group],
            ["--sampler", "grid", "--trials", "1000000"],
        ),
        ("budget", [d for d in drawn if d.index not in group], ["--trials", str(args.budget)]),
    ):
        if not members:
            continue
        path = folder / f"{name}.toml"
        _shape_file([d.problem for d in members], path)
        runs.append([*base, "--shapes", str(path), *extra])
    return runs


def cmd_search(args: argparse.Namespace) -> int:
    drawn = checked_draw(args)
    folder = Path(tempfile.mkdtemp(prefix="generalization-"))
    started = time.monotonic()
    for command in search_commands(drawn, args, folder):
        left = args.stop_after - (time.monotonic() - started)
        if left <= 0:
            break
        command += ["--stop-after", str(int(left))]
        print("+", " ".join(command), flush=True)
        if args.dry_run:
            continue
        done = subprocess.run(command, check=False)
        if done.returncode not in (0, 3):  # 3: stopped by --stop-after, resumable
            return done.returncode
    return 0


def _best_callables(problem: Any, scratch_db: str | None, layout: str):  # type: ignore[no-untyped-def]
    """extra(q, k, v) for the alternation: the search's best config of `problem` in the
    scratch database (a kernel built and loaded, or the SDPA backend it names), or nothing."""
    from autotune.build import compile_config
    from autotune.launch import CompiledKernel
    from autotune.model import target_for_device
    from autotune.runtime import device_info
    from autotune.store import TuningStore

    if scratch_db is None:
        return None, None
    best = TuningStore(scratch_db).best(device_info(0), problem)
    if best is None:
        return None, None
    config = best.config
    if config.family == "sdpa":
        from alternating_check import _sdpa

        named = str(config["backend"])
        backend = None if named == "default" else named

        def sdpa(q: Any, k: Any, v: Any) -> dict[str, Any]:
            qb, kb, vb = (t if layout == "bhld" else t.transpose(1, 2) for t in (q, k, v))
            return {"best": _sdpa(qb, kb, vb, problem.causal, backend)}

        return sdpa, config.to_json()
    build = compile_config(config, target_for_device(0))
    kernel = CompiledKernel(build)

    def ours(q: Any, k: Any, v: Any) -> dict[str, Any]:
        return {"best": lambda: kernel(q, k, v, layout=layout)}

    return ours, config.to_json()


def _twin(problem: Any) -> Any | None:
    """The bf16 twin of an fp16 decode problem with GQA and 4-16 query tokens."""
    from dataclasses import replace

    if (
        problem.dtype == "fp16"
        and problem.heads_q != problem.heads_kv
        and 4 <= problem.seqlen_q <= 16
    ):
        return replace(problem, dtype="bf16")
    return None


def _compile_first(problems: list[Any]) -> None:
    from why_cases import _compile_first as build_dispatched

    build_dispatched(problems)


def cmd_measure(args: argparse.Namespace) -> int:
    drawn = checked_draw(args)
    os.environ["CUTE_AUTOTUNE_DB"] = f"sqlite:///{tempfile.mkdtemp()}/empty.db"
    from alternating_check import alternating

    import autotune

    autotune.configure()  # the shipped db/ results only
    out = Path(args.json)
    doc = json.loads(out.read_text()) if out.exists() else {"seed": args.seed, "rows": []}
    if doc.get("seed") != args.seed:
        raise SystemExit(f"{out} holds rows of seed {doc.get('seed')}, not {args.seed}")
    done = {row["index"] for row in doc["rows"]}
    group = set(exhaustive_group(drawn, args.exhaustive, args.seed))
    todo = [d for d in drawn if d.index not in done]
    _compile_first([d.problem for d in todo] + [t for d in todo if (t := _twin(d.problem))])
    started = time.monotonic()
    for d in todo:
        if time.monotonic() - started > args.stop_after:
            print(f"stopped after {args.stop_after} s: run again to resume", flush=True)
            break
        extra, best_config = _best_callables(d.problem, args.scratch_db, d.layout)
        row = alternating(d.problem, calls=args.calls, layout=d.layout, extra=extra)
        row.update(d.row())
        row["search"] = "exhaustive" if d.index in group else "budget"
        row["best_config"] = best_config
        twin = _twin(d.problem)
        if twin is not None:
            twin_row = alternating(twin, calls=args.calls, layout=d.layout)
            row["twin"] = {
                "shape": twin_row["shape"],
                "speedup_vs_sdpa_default": twin_row["speedup_vs_sdpa_default"],
                "median_us": twin_row["median_us"],
            }
        doc["rows"].append(row)
        out.write_text(json.dumps(doc, indent=1) + "\n")  # each row kept as it is measured
        print(_line(row), flush=True)
    doc["command"] = " ".join(sys.argv)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


def _line(row: dict[str, Any]) -> str:
    times = row["median_us"]
    best = f"best {times['best']:9.1f} us" if "best" in times else "best (not searched)"
    return (
        f"{row['index']:3d} {row['kind']:<7} {row['layout']} {row['shape']:<40} ours "
        f"{times['ours']:9.1f} us SDPA {times['sdpa_default']:9.1f} us {best} "
        f"{row['speedup_vs_sdpa_default']:.3f}x  {str(row['dispatch'])[:50]}"
    )


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def judge(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets over measured rows: what holds, what does not, and on what."""
    below = [r for r in rows if r["ratio_vs_sdpa_default"]["ours"]["p80"] < FLOOR]
    verdict: dict[str, Any] = {
        "rows": len(rows),
        "speedup_geomean": geomean([r["speedup_vs_sdpa_default"] for r in rows]),
        "floor": {"holds": not below, "below": [r["shape"] for r in below]},
    }
    for group in ("exhaustive", "budget"):
        searched = [r for r in rows if r["search"] == group and "best" in r["median_us"]]
        regrets = [
            r["median_us"]["ours"] / min(v for k, v in r["median_us"].items() if k != "ours")
            for r in searched
        ]
        verdict[f"regret_{group}"] = {
            "searched": len(searched),
            "of": sum(r["search"] == group for r in rows),
            "geomean": geomean(regrets) if regrets else None,
            "worst": max(regrets) if regrets else None,
            "holds": bool(regrets)
            and geomean(regrets) <= REGRET_GEOMEAN
            and max(regrets) <= REGRET_WORST,
        }
    fp16 = [
        r
        for r in rows
        if "twin" in r and r["problem"]["batch"] * r["problem"]["seqlen_k"] >= 16384
    ]
    off_twin = [
        r["shape"]
        for r in fp16
        if r["speedup_vs_sdpa_default"]
        < (1 - TWIN_TOLERANCE) * r["twin"]["speedup_vs_sdpa_default"]
    ]
    fp16_mean = geomean([r["speedup_vs_sdpa_default"] for r in fp16])
    verdict["fp16_decode_gqa"] = {
        "rows": len(fp16),
        "geomean": fp16_mean if fp16 else None,
        "below_twin": off_twin,
        "holds": bool(fp16) and fp16_mean >= FP16_DECODE_GEOMEAN and not off_twin,
    }
    return verdict


def cmd_report(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    for path in args.json:
        rows.extend(json.loads(Path(path).read_text())["rows"])
    for row in sorted(rows, key=lambda r: r["index"]):
        print(_line(row))
    verdict = judge(rows)
    print(json.dumps(verdict, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    actions = parser.add_subparsers(dest="action", required=True)
    for name, func, text in (
        ("draw", cmd_draw, "list the drawn problems (no GPU)"),
        ("search", cmd_search, "tune them into the scratch database"),
        ("measure", cmd_measure, "time them in the alternating check"),
    ):
        p = actions.add_parser(name, help=text)
        p.add_argument("--seed", type=int, required=True)
        p.add_argument("--count", type=int, default=60, help="problems drawn (default 60)")
        p.add_argument(
            "--exhaustive",
            type=int,
            default=16,
            help="problems searched exhaustively (default 16)",
        )
        p.add_argument(
            "--model",
            action="append",
            help="a performance model whose fit problems may not be drawn "
            "(repeatable; default: every db/*.model.json)",
        )
        p.set_defaults(func=func)
        if name == "draw":
            p.add_argument("--json", help="write the drawn problems here")
            continue
        p.add_argument(
            "--scratch-db",
            required=name == "search",
            help="SQLAlchemy URL of the search's database",
        )
        p.add_argument(
            "--stop-after",
            type=float,
            default=480,
            help="start no new problem after this many seconds (default 480)",
        )
        if name == "search":
            p.add_argument(
                "--budget",
                type=int,
                default=160,
                help="trials per family outside the exhaustive group (default 160: "
                "4x tune's default)",
            )
            p.add_argument("--dry-run", action="store_true", help="print the commands only")
        else:
            p.add_argument("--json", required=True, help="rows (kept and resumed)")
            p.add_argument("--calls", type=int, default=40)
    p = actions.add_parser("report", help="judge measured rows against the targets (no GPU)")
    p.add_argument("--json", nargs="+", required=True)
    p.set_defaults(func=cmd_report)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
