"""`cute-autotune tune | best | list | misses | export | import | db`: the tuning-database
commands."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._jsonfile import read_json
from .._shown import for_terminal
from ..measure.environment import gpu_available
from ..model.hf_model import read_model
from ..model.problem import Problem
from ..model.shapes import load_shape_set
from ..model.space import SDPA_FAMILY, kernel_families, load_space
from ..store.misses_records import MissRecord
from ..store.records import BestRecord, DeviceInfo, TrialResult
from ..store.repo import BrokenRow, TuningStore
from ..store.schema import StoreError, default_url, describe, make_engine, upgrade
from ..tune.search import FamilyOutcome, Progress, SearchSettings, TuneOutcome
from ..tune.session import frequent_misses
from .args import add_causal, add_database, nonnegative_int, positive_float, positive_int
from .report import name_of
from .table import output_width, render_table


def add_problem_args(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--batch", type=positive_int, default=1, help="batch size B")
    p.add_argument("--heads-q", type=positive_int, required=required, help="query heads Hq")
    p.add_argument(
        "--heads-kv",
        type=positive_int,
        help="key/value heads Hkv, dividing Hq (default: --heads-q, MHA)",
    )
    p.add_argument("--seqlen-q", type=positive_int, required=required, help="query length Lq")
    p.add_argument("--seqlen-k", type=positive_int, help="key length Lk (default: --seqlen-q)")
    p.add_argument("--head-dim", type=positive_int, required=required, help="head dim D")
    p.add_argument("--dtype", choices=["fp16", "bf16"], help="element type (default: fp16)")
    add_causal(
        p,
        default=None,
        both=True,
        help="a causal mask, aligned bottom-right when Lq != Lk (default: false; with "
        "--shapes or --misses, false, true or both keep those problems only, "
        "default both)",
    )
    p.add_argument(
        "--kv-cache",
        metavar="KIND",
        help="how the keys are held: dense (default), seqlens (a padded cache with "
        "per-sequence lengths) or paged<N> (pages of N rows), the decode "
        "family's KV caches; with --shapes, keeps that kind only",
    )
    p.add_argument(
        "--backward",
        action="store_true",
        default=None,
        help="the backward pass (the gradients of q, k and v; its own best config, beside "
        "torch's backward); with --shapes, keeps backward problems only",
    )
    p.add_argument(
        "--deterministic",
        action="store_true",
        default=None,
        help="the deterministic backward (bit-identical gradients; implies --backward); with "
        "--shapes, keeps those only",
    )


def problem_from_args(args: argparse.Namespace) -> Problem:
    if args.causal == "both":
        raise ValueError(
            "--causal both keeps the problems of either mask of --shapes or "
            "--misses; one problem has one mask: --causal true or false"
        )
    return Problem(
        args.batch,
        args.heads_q,
        args.heads_kv or args.heads_q,
        args.seqlen_q,
        args.seqlen_k or args.seqlen_q,
        args.head_dim,
        args.dtype or "fp16",
        args.causal == "true",
        args.kv_cache or "dense",
        bool(getattr(args, "backward", None) or getattr(args, "deterministic", None)),
        bool(getattr(args, "deterministic", None)),
    )


def model_problems(args: argparse.Namespace) -> list[Problem]:
    """The problems of `--model` at `--batches`, `--lengths` and `--decode-tokens` (what it
    runs: printed, with what of it the kernels do not serve); none where no kernel family has
    its head dim."""
    model = read_model(args.model)
    if args.dtype:
        model = replace(model, shape=replace(model.shape, dtype=args.dtype))
    shape, layers = model.shape, f", {model.layers} layers" if model.layers else ""
    print(
        f"{for_terminal(model.name)}: {shape.heads_q} query heads, {shape.heads_kv} key/value "
        f"heads, head dim {shape.head_dim}, {shape.dtype}{layers}"
    )
    for note in model.notes:
        print(f"  note: {for_terminal(note)}")
    head_dims = sorted(
        {int(d) for f in kernel_families() for d in load_space(f).params["head_dim"].values}
    )
    if shape.head_dim not in head_dims:
        print(
            f"head dim {shape.head_dim} is not one the kernels have ({head_dims}): "
            "attention() runs torch SDPA for this model; nothing to tune",
            file=sys.stderr,
        )
        return []
    problems = model.problems(args.batches, args.lengths, args.decode_tokens)
    print(
        f"{len(problems)} problems: prefill at lengths {args.lengths} and decode steps of "
        f"{args.decode_tokens} tokens against those lengths, batch sizes {args.batches}"
    )
    return problems


def narrow_shape_set(problems: list[Problem], args: argparse.Namespace) -> list[Problem]:
    """--head-dim, --dtype and --causal given with --shapes keep only the matching problems, so
    that a long session can run as pieces of one head dim and dtype."""
    return [
        p
        for p in problems
        if (args.head_dim is None or p.head_dim == args.head_dim)
        and (args.dtype is None or p.dtype == args.dtype)
        and args.causal in (None, "both", str(p.causal).lower())
        and (getattr(args, "kv_cache", None) is None or p.kv_cache == args.kv_cache)
        and (getattr(args, "backward", None) is None or p.backward)
        and (getattr(args, "deterministic", None) is None or p.deterministic)
    ]


def _fmt(x: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "" if x is None else f"{x:{spec}}{suffix}"


# -- tune ---------------------------------------------------------------------------------------


def _families_arg(values: list[str] | None) -> list[str] | None:
    """--family sm80 --family sm90, or --family sm80,sm90; None when not given."""
    if not values:
        return None
    return [f.strip() for value in values for f in value.split(",") if f.strip()]


def cmd_tune(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..tune.backends import ReplayBackend
    from ..tune.search import families_to_search
    from ..tune.session import run_session
    from ..tune.tuning import open_backend

    if args.top is not None and not args.misses:
        print("--top goes with --misses", file=sys.stderr)
        return 2
    if args.misses:
        named = [
            flag
            for flag, value in (
                ("--shapes", args.shapes),
                ("--heads-q", args.heads_q),
                ("--heads-kv", args.heads_kv),
                ("--seqlen-q", args.seqlen_q),
                ("--seqlen-k", args.seqlen_k),
            )
            if value
        ]
        if named:
            print(
                f"tune --misses chooses the problems itself: drop {', '.join(named)} "
                "(--head-dim, --dtype and --causal narrow the misses)",
                file=sys.stderr,
            )
            return 2
        if args.top is not None and args.top < 1:
            print("--top must be at least 1", file=sys.stderr)
            return 2
        problems: list[Problem] = []  # chosen once the backend names the GPU
    elif args.model:
        named = [
            flag
            for flag, value in (
                ("--shapes", args.shapes),
                ("--heads-q", args.heads_q),
                ("--seqlen-q", args.seqlen_q),
                ("--head-dim", args.head_dim),
            )
            if value
        ]
        if named:
            print(
                f"tune --model takes the model's shapes: drop {', '.join(named)}", file=sys.stderr
            )
            return 2
        problems = model_problems(args)
        if not problems:
            return 1
    elif args.shapes:
        problems = narrow_shape_set(load_shape_set(args.shapes), args)
        if not problems:
            print(
                f"no problem of shape set {args.shapes} matches --head-dim/--dtype/--causal",
                file=sys.stderr,
            )
            return 2
    elif args.heads_q and args.seqlen_q and args.head_dim:
        problems = [problem_from_args(args)]
    else:
        print(
            "tune needs a shape (--heads-q --seqlen-q --head-dim ...), --shapes SET, "
            "--model CONFIG or --misses",
            file=sys.stderr,
        )
        return 2
    if args.enqueue and args.misses:
        print("--enqueue takes a shape or --shapes, not --misses", file=sys.stderr)
        return 2
    if not args.replay and not (args.enqueue and args.for_gpu):
        if not gpu_available():
            print(
                "cute-autotune tune times kernels on a CUDA GPU and none is visible here "
                "(--replay RECORDING serves recorded measurements instead).",
                file=sys.stderr,
            )
            return 2
    # A piece of a long session (--skip-tuned) completes each interrupted study's budget; a
    # plain run adds --trials new trials to what the study holds.
    settings = search_settings(args)
    if args.enqueue:
        from .workers import enqueue

        if args.for_gpu:
            device = args.for_gpu
        else:
            probe = open_backend(args.replay)
            device = probe.device()
            probe.close()
        return enqueue(args.db, device, problems, _families_arg(args.family) or [], settings)
    rows: list[list[Any]] = []
    outcomes: list[TuneOutcome] = []
    backend = open_backend(args.replay)
    try:
        device_name = backend.device().name
        if args.misses:
            problems = misses_to_tune(args, backend.device())
        if isinstance(backend, ReplayBackend):
            backend.require_recorded(problems)
        families = families_to_search(backend, _families_arg(args.family))
    except (ValueError, StoreError):
        backend.close()
        raise
    if not problems:
        backend.close()
        print(
            f"no untuned runtime misses of {_gpu_model(backend.device())} in "
            f"{describe(args.db or default_url())}: nothing to tune"
        )
        return 0
    # One bar for the session: each shape owns trials x families steps, and a shape that ends
    # (searched, skipped, or ending with fewer trials: pruned, reused, out of budget) moves the
    # bar to its end, so the bar reaches 100% when the session does.
    per_shape = settings.trials * len(families)
    bar = tqdm(
        total=per_shape * len(problems), file=sys.stderr, disable=args.quiet, dynamic_ncols=True
    )
    shapes_done = 0

    def shape_done() -> None:
        nonlocal shapes_done
        shapes_done += 1
        bar.update(shapes_done * per_shape - bar.n)

    def on_progress(p: Progress) -> None:
        if bar.n < (shapes_done + 1) * per_shape:
            bar.update(1)
        bar.set_postfix_str(
            f"{p.family}: failed {p.failed} pruned {p.pruned} reused {p.reused} "
            f"best {_fmt(p.best_tflops())} TFLOP/s x{_fmt(p.speedup(), '.2f')} "
            "SDPA"
        )

    def on_outcome(o: TuneOutcome) -> None:
        outcomes.append(o)
        if args.json:  # after every shape, so that a session stopped midway keeps its results
            Path(args.json).write_text(json.dumps([outcome_json(x) for x in outcomes], indent=1))
        rows.extend(outcome_rows(o, marked=len(families) > 1))

    def on_start(i: int, problem: Problem) -> None:
        bar.set_description(f"[{i + 1}/{len(problems)}] {problem.describe()}")

    try:
        session = run_session(
            problems,
            db=args.db,
            backend=backend,
            settings=settings,
            families=families,
            skip_tuned=args.skip_tuned,
            stop_after=args.stop_after,
            on_start=on_start,
            on_end=lambda _: shape_done(),
            on_progress=on_progress,
            on_outcome=on_outcome,
        )
    finally:
        bar.close()
        backend.close()
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
            rows,
        )
    )
    if len(families) > 1:
        print("\n* the problem's best config: the fastest of all families in the final re-timing")
    searched = [f for o in outcomes for f in o.families]
    if searched:
        print("\n" + trial_counts_note(searched))
    if session.skipped:
        print(
            f"\n--stop-after {args.stop_after:.0f} s: {len(session.skipped)} shapes not "
            "started; run it again with --skip-tuned to continue"
        )
    if outcomes and not args.no_refit and not args.quick:
        print("\n" + refit_message(args.db, device_name, "tune"))
    return 0 if all(o.best for o in outcomes) else 1


def refit_message(db: str | None, device: str, fitted_by: str) -> str:
    """Refit `device`'s performance model in the database (tune/refit.py) and say what came of
    it; a failure is said, never raised: the results it follows are kept either way."""
    from ..tune.refit import refit

    try:
        return refit(TuningStore(db), device, fitted_by).message
    except (StoreError, ValueError) as exc:
        return f"the performance model of {device} was not refitted: {exc}"


def gpu_model(text: str) -> DeviceInfo:
    """'NVIDIA H200:90:132' -> the GPU model a work item is for (argparse type)."""
    parts = text.rsplit(":", 2)
    try:
        name, cc, sms = parts[0].strip(), int(parts[1]), int(parts[2])
    except (IndexError, ValueError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not NAME:CC:SMS, e.g. 'NVIDIA H200:90:132'"
        ) from None
    if not name or not 10 <= cc <= 200 or not 1 <= sms <= 100_000:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a name, a compute capability such as 90 and an SM count are needed"
        )
    return DeviceInfo(name, cc, sms, "", "")


def _gpu_model(device: DeviceInfo) -> str:
    return device.model


def misses_to_tune(args: argparse.Namespace, device: DeviceInfo) -> list[Problem]:
    """tune --misses: the --top (default 10) most frequent untuned misses of this GPU model
    that --head-dim/--dtype/--causal keep (tune/session.frequent_misses), said on stderr."""
    chosen = frequent_misses(
        TuningStore(args.db, create=False),
        device,
        keep=lambda ranked: narrow_shape_set(ranked, args),
        top=args.top or 10,
    )
    if chosen and not args.quiet:
        print(
            f"tuning the {len(chosen)} most frequent untuned misses of "
            f"{_gpu_model(device)}: "
            + "; ".join(f"{p.describe()} ({calls} calls)" for p, calls in chosen),
            file=sys.stderr,
        )
    return [p for p, _ in chosen]


def _speedup(o: TuneOutcome, result: TrialResult | None, backend: str) -> float | None:
    base = o.baselines.get(backend)
    if result is None or not result.median_us or base is None:
        return None
    return base.median_us / result.median_us


def trial_counts_note(searched: Sequence[FamilyOutcome]) -> str:
    """How the table's counts add up to Optuna's (optuna-dashboard shows more trials)."""
    optuna = sum(f.optuna_trials for f in searched)
    return textwrap.fill(
        f"Optuna counts {optuna} trials in these studies: besides the configs measured (the "
        "trials column) they hold the proposals pruned by the space's constraints and the "
        "repeats of a measured config, told its time again (user attribute `status`).",
        output_width(),
    )


def outcome_rows(o: TuneOutcome, marked: bool) -> list[list[Any]]:
    """Table rows of a problem's session: one per family, the winner's first (marked with *
    when several families competed)."""
    from ..model.space import load_space

    winner = o.best.config.family if o.best else None
    entries: list[tuple[str, TrialResult | None, str, Any]] = [
        (
            f.family,
            f.best,
            f"{f.evaluated}+{f.reused} ({_swept(f)}{f.failed} failed, "
            f"{f.pruned} pruned, {f.repeated} repeated)",
            f.total_trials,
        )
        for f in o.families
    ]
    if o.best is not None and o.family(o.best.config.family) is None:
        entries.append(
            (
                o.best.config.family,
                o.best,
                "torch SDPA, re-timed with the finalists"
                if o.best.config.family == SDPA_FAMILY
                else "earlier best, re-timed",
                "",
            )
        )
    entries.sort(key=lambda e: e[0] != winner)  # stable: the winner's family first
    rows = []
    for i, (family, result, session, trials) in enumerate(entries):
        rows.append(
            [
                o.problem.describe() if i == 0 else "",
                family + (" *" if marked and family == winner else ""),
                load_space(family).name_of(result.config) if result else "(none passed)",
                _fmt(result.tflops(o.problem) if result else None),
                _fmt(_speedup(o, result, "default"), ".2f", "x"),
                _fmt(_speedup(o, result, "flash"), ".2f", "x"),
                session,
                trials,
            ]
        )
    return rows


def outcome_json(o: TuneOutcome) -> dict[str, Any]:
    return {
        **o.problem.as_dict(),
        "family": o.best.config.family if o.best else None,
        "config": o.best.config.as_dict() if o.best else None,
        "tflops": o.tflops(),
        "median_us": o.best.median_us if o.best else None,
        "sdpa": {
            k: {"median_us": b.median_us, "tflops": o.problem.tflops(b.median_us)}
            for k, b in o.baselines.items()
        },
        "sdpa_default_tflops": _tflops(o, "default"),
        "sdpa_flash_tflops": _tflops(o, "flash"),
        "speedup_vs_default": o.speedup("default"),
        "speedup_vs_flash": o.speedup("flash"),
        "trials": o.total_trials,
        "evaluated_now": o.evaluated,
        "failed_now": o.failed,
        "pruned_now": o.pruned,
        "study": o.study,
        "device": o.device.as_dict(),
        "families": {
            f.family: {
                "study": f.study,
                "config": f.best.config.as_dict() if f.best else None,
                "median_us": f.best.median_us if f.best else None,
                "tflops": f.tflops(o.problem),
                "speedup_vs_default": _speedup(o, f.best, "default"),
                "speedup_vs_flash": _speedup(o, f.best, "flash"),
                "trials": f.total_trials,
                "evaluated_now": f.evaluated,
                "failed_now": f.failed,
                "pruned_now": f.pruned,
                "reused_now": f.reused,
                "repeated_now": f.repeated,
                "swept_now": f.swept,
                "optuna_trials": f.optuna_trials,
            }
            for f in o.families
        },
    }


def _swept(f: Any) -> str:
    """How many of a family's evaluated configs were launch values of builds it had made."""
    builds = f.evaluated - f.swept
    return f"{builds} builds with all their launch values, " if f.swept else ""


def _tflops(o: TuneOutcome, backend: str) -> float | None:
    base = o.baselines.get(backend)
    return o.problem.tflops(base.median_us) if base else None


# -- best / list --------------------------------------------------------------------------------


def _record_row(r: BestRecord) -> list[Any]:

    return [
        r.device.name,
        r.problem.describe(),
        r.config.family,
        name_of(r.config),
        _fmt(r.tflops),
        _fmt(r.speedup_vs_default, ".2f", "x"),
        _fmt(r.speedup_vs_flash, ".2f", "x"),
        r.trials,
        r.source,
    ]


def _timed_kernel(r: BestRecord, timed_key: str | None) -> str:
    """Whether the stored timing (of the build `timed_key`, TuningStore.timed_build_keys) is of
    the kernel a dispatch builds today: "current", "older" (the kernel sources, toolchain or
    flags changed since: re-tune with --skip-tuned), "recorded" (a replayed recording), "torch"
    (an SDPA backend: nothing of ours was built), or "?" (imported rows carry no build; no
    toolchain here to tell)."""
    from ..build.compiler import build_key
    from ..build.toolchain import ToolchainError
    from ..model.target import target_for_arch
    from ..tune.backends import REPLAY_KEY_PREFIX

    if r.config.family == SDPA_FAMILY:
        return "torch"
    if not timed_key:
        return "?"
    if timed_key.startswith(REPLAY_KEY_PREFIX):
        return "recorded"
    try:
        current = build_key(r.config, target_for_arch(r.device.compute_capability))
    except (ToolchainError, ValueError):
        return "?"
    return "current" if current == timed_key else "older"


def _record_json(r: BestRecord) -> dict[str, Any]:
    return {
        "device": r.device.as_dict(),
        "problem": r.problem.as_dict(),
        "family": r.config.family,
        "config": r.config.as_dict(),
        "median_us": r.median_us,
        "tflops": r.tflops,
        "sdpa_default_us": r.sdpa_default_us,
        "sdpa_flash_us": r.sdpa_flash_us,
        "speedup_vs_default": r.speedup_vs_default,
        "speedup_vs_flash": r.speedup_vs_flash,
        "trials": r.trials,
        "source": r.source,
        "study": r.study,
        "p20_us": r.p20_us,
        "p80_us": r.p80_us,
        "decision": r.decision,
        "runner_up_us": r.runner_up_us,
        "torch_version": r.torch_version,
        "cudnn_version": r.cudnn_version,
        "regime": r.regime,
    }


def reading_url(db: str | None) -> str | None:
    """The database a read-only command reads: `db`, except on a fresh install (no --db, no
    $CUTE_AUTOTUNE_DB, the default file not made yet), where it is a scratch copy of the
    results shipped in db/ (what `attention()` imports on first use), said on stderr."""
    import atexit
    import os
    import shutil
    import tempfile

    from sqlalchemy.engine import make_url

    from .._paths import shipped_results_files
    from ..store.schema import DB_ENV, sqlite_path

    if db is not None or os.environ.get(DB_ENV):
        return db
    default = default_url()
    path = sqlite_path(make_url(default))
    files = shipped_results_files()
    if path is None or path.exists() or not files:
        return db
    folder = tempfile.mkdtemp(prefix="cute-autotune-shipped-")
    atexit.register(shutil.rmtree, folder, True)
    scratch = f"sqlite:///{folder}/shipped.db"
    store = TuningStore(scratch)
    for file in files:
        store.import_results(read_json(file))
    store.engine.dispose()
    print(
        f"(no tuning database at {path} yet: answered from the results shipped in db/, "
        "which attention() imports there on its first call on such a GPU)",
        file=sys.stderr,
    )
    return scratch


def cmd_best(args: argparse.Namespace) -> int:
    from ..model.space import SDPA_FAMILY, families, load_space
    from ..tune.tuning import best_config

    problem = problem_from_args(args)
    held = sorted(
        {
            int(d)
            for f in families()
            if f != SDPA_FAMILY
            for d in load_space(f).params["head_dim"].values
        }
    )
    if problem.head_dim not in held:
        print(
            f"no kernel family holds head dim {problem.head_dim} (they hold {held}): "
            f"nothing is tuned for {problem.describe()}; attention() runs torch SDPA there",
            file=sys.stderr,
        )
        return 1
    db = reading_url(args.db)
    answer = best_config(problem, db=db, device=args.device, nearest=not args.exact)
    if answer is None:
        print(
            f"no tuned config for {problem.describe()}"
            f"{'' if args.exact else ' nor for any problem of its dtype, head dim and mask'}"
            f" in {describe(db or default_url())}",
            file=sys.stderr,
        )
        return 1
    r = answer.record
    lines = []  # names and notes from the database, escaped when printed
    if answer.match == "exact":
        lines.append(f"exact match: {problem.describe()} on {r.device.name}")
    else:
        lines.append(
            f"no exact match for {problem.describe()}; nearest tuned problem is "
            f"{r.problem.describe()} on {r.device.name} "
            f"(distance {answer.distance:.2f})"
        )
    lines.append(f"family: {r.config.family} ({name_of(r.config)})")
    lines.append(f"config: {r.config.to_json()}")
    lines.append(
        f"measured: {r.median_us:.1f} us, {r.tflops:.1f} TFLOP/s; SDPA default "
        f"{_fmt(r.sdpa_default_us, '.1f', ' us')} ({_fmt(r.speedup_vs_default, '.2f', 'x')}), "
        f"FLASH {_fmt(r.sdpa_flash_us, '.1f', ' us')} ({_fmt(r.speedup_vs_flash, '.2f', 'x')}); "
        f"{r.trials} trials, {r.source}"
    )
    if r.p20_us is not None and r.p80_us is not None:
        lines.append(f"spread: p20 {r.p20_us:.1f} us, p80 {r.p80_us:.1f} us")
    if r.decision:
        lines.append(f"decided: {r.decision}")
    if r.torch_version or r.cudnn_version or r.regime:
        lines.append(
            f"timed under: torch {r.torch_version or '?'}, "
            f"cuDNN {r.cudnn_version or '?'}, regime {r.regime or '?'}"
        )
    for line in lines:
        print(for_terminal(line))
    if args.json:
        timed = TuningStore(db, create=False).timed_build_keys(r.device.name)
        Path(args.json).write_text(
            json.dumps(
                {
                    "match": answer.match,
                    "distance": answer.distance,
                    **_record_json(r),
                    "timed_kernel": _timed_kernel(r, timed.get((r.device.name, r.problem))),
                },
                indent=1,
            )
        )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    store = TuningStore(reading_url(args.db), create=False)
    records = store.list_best(args.device)
    timed = store.timed_build_keys(args.device)
    print(
        render_table(
            [
                "device",
                "problem",
                "family",
                "best config",
                "TFLOP/s",
                "vs SDPA",
                "vs FLASH",
                "trials",
                "source",
                "timed kernel",
            ],
            [
                [*_record_row(r), _timed_kernel(r, timed.get((r.device.name, r.problem)))]
                for r in records
            ],
            movable=["best config", "timed kernel", "device"],
        )
    )
    broken = store.broken_rows()
    for reason in broken:
        print(f"refused a stored row: {reason}", file=sys.stderr)
    print(f"\n{len(records)} tuned problems in {describe(store.url)}")
    return 0


# -- misses -------------------------------------------------------------------------------------


def cmd_misses(args: argparse.Namespace) -> int:
    store = TuningStore(args.db, create=False)
    records = store.list_misses(args.device, limit=args.top)
    if args.json:
        print(json.dumps([r.as_dict() for r in records], indent=1))
        return 0
    where = describe(store.url) + (f" for {args.device}" if args.device else "")
    if not records:
        print(f"no runtime misses recorded in {where}")
        return 0
    print(
        render_table(
            ["count", "path", "problem", "device", "last seen (UTC)"],
            [_miss_row(r) for r in records],
        )
    )
    print(
        f"\n{len(records)} misses ({sum(r.count for r in records)} calls) in {where}; "
        "`cute-autotune tune --misses` tunes the most frequent"
    )
    return 0


def _miss_row(r: MissRecord) -> list[Any]:
    return [
        r.count,
        r.path,
        r.problem.describe(),
        r.device_name,
        r.last_seen[:19].replace("T", " "),
    ]


# -- export / import / db -----------------------------------------------------------------------


def cmd_export(args: argparse.Namespace) -> int:
    data = TuningStore(reading_url(args.db), create=False).export(args.device)
    text = json.dumps(data, indent=1)
    if args.output:
        Path(args.output).write_text(text + "\n")
        print(f"exported {len(data['results'])} results to {args.output}", file=sys.stderr)
    else:
        print(text)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    data = read_json(args.file)
    try:
        counts = TuningStore(args.db).import_results(data, overwrite=args.overwrite)
    except BrokenRow as exc:
        print(f"{args.file}: {exc}", file=sys.stderr)
        return 2
    duplicates = (
        f"; {counts['duplicates']} entries repeated an earlier one" if counts["duplicates"] else ""
    )
    print(
        f"imported {counts['imported']} results; kept {counts['kept_existing']} existing "
        f"(--overwrite replaces them){duplicates}"
    )
    if counts["imported"] and not args.no_refit:
        for device in sorted({str(entry["device"]["name"]) for entry in data["results"]}):
            print(refit_message(args.db, device, "import"))
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    url = args.db or default_url()
    done = upgrade(make_engine(url))
    print(f"{describe(url)}: schema {done.before or '(none)'} -> {done.after} ({done.done})")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from ..runtime.attention import configure
    from .bench import bench_problem, plot, summarize

    if not gpu_available():
        print(
            "cute-autotune bench times kernels on a CUDA GPU and none is visible here.",
            file=sys.stderr,
        )
        return 2
    import torch

    configure(db=args.db)
    rows = [bench_problem(p, rounds=args.rounds) for p in load_shape_set(args.shapes)]
    data = summarize(rows)
    data.update(
        gpu=torch.cuda.get_device_name(),
        shapes=args.shapes,
        command=" ".join(["cute-autotune", *sys.argv[1:]]),
    )
    print(
        render_table(
            [
                "shape",
                "path",
                "family",
                "TFLOP/s",
                "SDPA default",
                "SDPA FLASH",
                "speed-up",
                "rel err",
            ],
            [
                [
                    r["shape"],
                    r["path"],
                    r.get("family") or "",
                    _fmt(r["tflops"]),
                    _fmt(r.get("sdpa_default_tflops")),
                    _fmt(r.get("sdpa_flash_tflops")),
                    _fmt(r["speedup_vs_sdpa_default"], ".2f", "x"),
                    f"{r['rel_err_vs_sdpa']:.1e}",
                ]
                for r in rows
            ],
        )
    )
    print(
        f"\ngeomean speed-up vs SDPA default {data['geomean_vs_sdpa_default']:.2f}x "
        f"(worst {data['worst_vs_sdpa_default']:.2f}x), "
        f"vs SDPA FLASH {data['geomean_vs_sdpa_flash']:.2f}x; shapes per family: "
        + ", ".join(f"{f} {n}" for f, n in data["rows_per_family"].items())
    )
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1))
    if args.plot and not plot(data, Path(args.plot), f"{args.shapes} on {data['gpu']}"):
        print("(no plot: matplotlib is not installed)", file=sys.stderr)
    return 0


# -- report / recheck ---------------------------------------------------------------------------


def cmd_report(args: argparse.Namespace) -> int:
    from .report import (
        NOT_MEASURED,
        by_device,
        plot_regret,
        regret_report,
        report_dispatcher,
        summarize,
    )

    store = TuningStore(reading_url(args.db), create=False)
    rows = regret_report(store, report_dispatcher(store), args.device)
    if not rows:
        print(
            f"no stored best configs in {describe(store.url)}"
            + (f" for {args.device}" if args.device else "")
        )
        return 0
    for (name, cc, sm), group in by_device(rows).items():
        print(
            f"{for_terminal(name)} (sm_{cc}, {sm} SMs): what dispatch runs, against the "
            "fastest measured"
        )
        print(
            render_table(
                [
                    "problem",
                    "path",
                    "dispatched config",
                    "its time",
                    "best measured",
                    "best config",
                    "SDPA default",
                    "regret",
                ],
                [
                    [
                        r.problem.describe(),
                        r.path,
                        r.config_name,
                        _fmt(r.dispatched_us, ".1f", " us") or NOT_MEASURED,
                        _fmt(r.best_us, ".1f", " us"),
                        "(same)" if r.best_name == r.config_name else r.best_name,
                        _fmt(r.sdpa_default_us, ".1f", " us"),
                        _fmt(r.regret, ".3f", "x"),
                    ]
                    for r in group
                ],
            )
        )
        print(f"\n{summarize(group).describe()}\n")
    print(
        textwrap.fill(
            "regret: the dispatched config's latest time over the fastest time "
            "measured on the problem (any config, torch SDPA's included); (same): "
            "the fastest is the dispatched config itself (above 1.000x: an earlier "
            "timing of it)",
            output_width(),
        )
    )
    if args.json:
        Path(args.json).write_text(json.dumps([r.as_dict() for r in rows], indent=1))
    if args.plot and not plot_regret(rows, Path(args.plot)):
        print(
            f"no plot written to {args.plot}: matplotlib is not installed "
            "(pip install matplotlib)",
            file=sys.stderr,
        )
    return 0


def cmd_recheck(args: argparse.Namespace) -> int:
    from ..tune.backends import ReplayBackend
    from ..tune.recheck import recheck
    from ..tune.tuning import open_backend

    if args.rounds is not None and args.rounds < 1:
        print("--rounds must be at least 1", file=sys.stderr)
        return 2
    wanted = [p for name in args.shapes for p in load_shape_set(name)] if args.shapes else None
    if not args.replay:
        if not gpu_available():
            print(
                "cute-autotune recheck times kernels on a CUDA GPU and none is visible here "
                "(--replay RECORDING serves recorded measurements instead).",
                file=sys.stderr,
            )
            return 2
    TuningStore(args.db, create=False)  # a database that does not exist is an error
    store = TuningStore(args.db)
    settings = (
        SearchSettings() if args.rounds is None else SearchSettings(rerank_rounds=args.rounds)
    )
    backend = open_backend(args.replay)
    try:
        device = backend.device()
        problems = [
            r.problem for r in store.list_best(device) if wanted is None or r.problem in wanted
        ]
        if isinstance(backend, ReplayBackend):
            recorded = set(backend.problems)
            left = [p for p in problems if p not in recorded]
            problems = [p for p in problems if p in recorded]
            if left:
                print(
                    f"{len(left)} stored bests not in the replayed recordings are not rechecked",
                    file=sys.stderr,
                )
        if not problems:
            print(f"no stored best of {_gpu_model(device)} to recheck in {describe(store.url)}")
            return 0
        rows = recheck(store, backend, problems, settings)
    finally:
        backend.close()

    def timed(t: TrialResult | None) -> str:
        return "did not run" if t is None else f"{_fmt(t.median_us, '.1f', ' us')}"

    print(
        render_table(
            [
                "problem",
                "stored winner",
                "versions then -> now",
                "stored winner now",
                "fastest now",
                "verdict",
            ],
            [
                [
                    r.problem.describe(),
                    name_of(r.stored),
                    r.versions,
                    f"{timed(r.stored_now)} (was {r.stored_then_us:.1f} us)",
                    ""
                    if r.fastest_now is None
                    else f"{name_of(r.fastest_now.config)} {timed(r.fastest_now)}",
                    r.verdict,
                ]
                for r in rows
            ],
        )
    )
    redecided = sum(r.redecided for r in rows)
    print(
        f"\n{len(rows)} stored bests of {_gpu_model(device)} rechecked, {redecided} re-decided"
        f" (new timings recorded with phase 'recheck' in {describe(store.url)})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps([r.as_dict() for r in rows], indent=1))
    return 0


# `tune --quick`: the model sampler's defaults (tune/model_seeding.py). 12 builds compile in one
# round on a 16-core GPU host; each family times at most 6 of them, two at a time, so that it
# can stop as soon as its leader is separated; two finalists per family are re-timed with SDPA.
QUICK = {
    "sampler": "model",
    "trials": 6,
    "prebuild": 12,
    "batch_size": 2,
    "rerank_top": 2,
    "warm_start": 1,
}
PLAIN = {"sampler": "tpe", "trials": 40, "batch_size": 4, "rerank_top": 5}


def search_settings(args: argparse.Namespace) -> SearchSettings:
    """The settings of `tune`'s arguments: --quick's defaults or the plain ones, each given
    option over them."""
    base: dict[str, Any] = dict(QUICK if args.quick else PLAIN)
    for name in ("sampler", "trials", "batch_size", "rerank_top"):
        if getattr(args, name) is not None:
            base[name] = getattr(args, name)
    if args.perf_model is not None:
        base["perf_model"] = args.perf_model
    return SearchSettings(
        seed=args.seed,
        time_budget_s=args.time_budget,
        reuse=not args.no_reuse,
        resume=args.skip_tuned,
        sdpa_finalists=not args.without_sdpa,
        **base,
    )


def register(sub: Any) -> None:
    p = sub.add_parser("tune", help="tune one shape or a shape set into the database")
    add_problem_args(p, required=False)
    p.add_argument(
        "--shapes",
        help="a shape set: a name in search_spaces/shapes or a TOML path "
        "(narrowed by --head-dim, --dtype and --causal when given)",
    )
    p.add_argument(
        "--model",
        metavar="CONFIG",
        help="tune the problems a Hugging Face model runs: its config.json, a folder "
        "holding one, or a model id in the local Hugging Face cache (nothing is "
        "downloaded); at --batches, --lengths and --decode-tokens",
    )
    p.add_argument(
        "--batches",
        type=positive_int,
        nargs="+",
        default=[1, 8],
        metavar="B",
        help="with --model: the batch sizes served (default: 1 8)",
    )
    p.add_argument(
        "--lengths",
        type=positive_int,
        nargs="+",
        default=[2048, 8192],
        metavar="L",
        help="with --model: the prompt lengths and KV-cache lengths served (default: 2048 8192)",
    )
    p.add_argument(
        "--decode-tokens",
        type=positive_int,
        nargs="+",
        default=[1],
        metavar="T",
        help="with --model: query tokens per decode step (default: 1; add 4 8 for "
        "speculative decoding's verify steps)",
    )
    p.add_argument(
        "--family",
        action="append",
        metavar="FAMILY",
        help="kernel family to search (repeatable, or a comma list; default: every "
        "family the GPU runs, e.g. sm80 and sm90 on an H200)",
    )
    p.add_argument(
        "--without-sdpa",
        action="store_true",
        help="leave torch SDPA's backends out of the final re-ranking (to study the "
        "kernels alone; the stored best may then be slower than SDPA)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a new problem in about a minute: the performance model's fastest "
        "predicted configs across families compiled together (12 builds), timed best "
        "predicted first, each family stopping once its leader is separated, then "
        "re-ranked with SDPA (--sampler model --trials 6 --batch-size 2 "
        "--rerank-top 2)",
    )
    p.add_argument(
        "--trials",
        type=positive_int,
        help="new configs to evaluate per shape and family (default: 40; --quick: 6)",
    )
    p.add_argument(
        "--sampler",
        choices=["tpe", "grid", "random", "model"],
        help="how configs are proposed (default: tpe; model: ranked by the "
        "performance model, see --quick)",
    )
    p.add_argument(
        "--perf-model",
        metavar="FILE",
        help="the performance model the model sampler ranks with (`cute-autotune "
        "model fit`; default: the one shipped in db/ for the GPU)",
    )
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the sampler")
    p.add_argument(
        "--time-budget", type=positive_float, help="seconds of search per shape and family"
    )
    p.add_argument(
        "--stop-after",
        type=positive_float,
        help="start no new shape after this many seconds (resume by running again)",
    )
    p.add_argument(
        "--skip-tuned",
        action="store_true",
        help="skip shapes whose every family (of --family) was searched into the "
        "database's best config on this GPU by an earlier run, and complete the "
        "budget of a study an earlier run left unfinished (its trials count)",
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        help="configs compiled per batch (default: 4; --quick: 2)",
    )
    p.add_argument(
        "--rerank-top",
        type=positive_int,
        help="finalists of each family re-timed together at the end (default: 5; --quick: 2)",
    )
    p.add_argument(
        "--no-reuse",
        action="store_true",
        help="time configs again even when the database has a measurement",
    )
    p.add_argument(
        "--replay",
        action="append",
        metavar="RECORDING",
        help="serve measurements recorded by benchmarks/sweep.py instead of a GPU "
        "(repeatable: one recording per family)",
    )
    p.add_argument(
        "--misses",
        action="store_true",
        help="tune the problems `attention()` served most often without an exact "
        "tuned entry on this GPU (`cute-autotune misses`; problems tuned since are "
        "left out; narrowed by --head-dim, --dtype and --causal when given)",
    )
    p.add_argument(
        "--top",
        type=positive_int,
        metavar="N",
        help="with --misses: how many problems (default: 10)",
    )
    p.add_argument(
        "--enqueue",
        action="store_true",
        help="add the problems to the work queue of the database instead of tuning "
        "them here (`cute-autotune worker` takes them, `cute-autotune queue` shows "
        "them): for the GPU model visible here, of --replay's recording, or --for-gpu",
    )
    p.add_argument(
        "--for-gpu",
        type=gpu_model,
        metavar="NAME:CC:SMS",
        help="with --enqueue: the GPU model the items are for, e.g. "
        "'NVIDIA H200:90:132' (name, compute capability, SM count)",
    )
    p.add_argument(
        "--no-refit",
        action="store_true",
        help="leave the GPU's performance model in the database as it is (by "
        "default it is refitted over the database after the session, where "
        "scikit-learn is installed; never after --quick, kept quick)",
    )
    p.add_argument("--json", help="write the outcomes to this file")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("best", help="the best tuned config for a shape")
    add_problem_args(p, required=True)
    p.add_argument("--device", help="a device name, e.g. 'NVIDIA H200' (default: any)")
    p.add_argument("--exact", action="store_true", help="no nearest-shape fallback")
    p.add_argument("--json", help="write the answer to this file")
    p.set_defaults(func=cmd_best)

    p = sub.add_parser("list", help="every tuned problem in the database")
    p.add_argument("--device", help="a device name, e.g. 'NVIDIA H200' (default: any)")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "misses",
        help="problems `attention()` served without an exact tuned "
        "entry, the most frequent first ($CUTE_AUTOTUNE_RECORD_MISSES=0: none "
        "recorded)",
    )
    p.add_argument("--device", help="a device name, e.g. 'NVIDIA H200' (default: any)")
    p.add_argument("--top", type=positive_int, metavar="N", help="only the N most frequent")
    p.add_argument("--json", action="store_true", help="print them as JSON")
    p.set_defaults(func=cmd_misses)

    p = sub.add_parser("export", help="tuned results as JSON")
    p.add_argument("--device", help="a device name, e.g. 'NVIDIA H200' (default: any)")
    p.add_argument("-o", "--output", help="write here (default: standard output)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("import", help="import results exported by `export` (validated)")
    p.add_argument("file", help="a file written by `cute-autotune export`")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace stored results of the same device and problem",
    )
    p.add_argument(
        "--no-refit",
        action="store_true",
        help="leave the performance models in the database as they are (by default "
        "each imported GPU model's is refitted, where scikit-learn is installed)",
    )
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("db", help="database maintenance")
    p.add_argument(
        "action",
        choices=["upgrade"],
        help="upgrade: migrate the database to this release's schema",
    )
    p.set_defaults(func=cmd_db)

    p = sub.add_parser("bench", help="tuned dispatch against torch SDPA on a shape set")
    p.add_argument("--shapes", required=True, help="a shape set name or TOML path")
    p.add_argument(
        "--rounds", type=positive_int, default=7, help="alternation rounds of the timing"
    )
    p.add_argument("--json", help="write rows and geometric means here")
    p.add_argument("--plot", help="write a PNG bar chart here (needs matplotlib)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "report",
        help="what dispatch runs for every stored best, its measured "
        "time against the fastest measured there (regret), worst first",
    )
    p.add_argument("--device", help="a device name, e.g. 'NVIDIA H200' (default: every GPU)")
    p.add_argument("--plot", help="write a PNG bar chart of regret per problem (needs matplotlib)")
    p.add_argument("--json", help="write the rows here")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "recheck",
        help="re-time each stored best of this GPU beside its "
        "runners-up and torch SDPA (after a driver, CUDA, torch or cuDNN "
        "upgrade); decide again only where the order moved beyond the noise",
    )
    p.add_argument(
        "--shapes",
        nargs="+",
        metavar="NAME",
        help="only the problems of these shape sets (default: every stored best)",
    )
    p.add_argument(
        "--replay",
        action="append",
        metavar="RECORDING",
        help="serve measurements recorded by benchmarks/sweep.py instead of a GPU "
        "(repeatable: one recording per family)",
    )
    p.add_argument(
        "--rounds",
        type=positive_int,
        help="alternation rounds of the re-timing (default: that of tune's re-ranking)",
    )
    p.add_argument("--json", help="write the rows here")
    p.set_defaults(func=cmd_recheck)

    for name in ("report", "recheck"):
        add_database(sub.choices[name])

    for name in ("tune", "best", "list", "misses", "export", "import", "db", "bench"):
        add_database(sub.choices[name])
