"""The `cute-autotune` command line."""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._jsonfile import JsonInputError, loads_json, read_json
from .._shown import for_terminal
from ..build.cache import CacheNotWritable
from ..build.compiler import BuildResult, compile_many, default_jobs
from ..build.toolchain import ToolchainError, toolchain
from ..measure.environment import gpu_available
from ..measure.validate import ValidationReport
from ..measure.worker import WorkerFailure
from ..model.config import Config, InvalidConfig, Value
from ..model.space import load_space
from ..model.status import Status
from ..model.target import Target, default_target, target_for_arch
from ..store.schema import StoreError
from ..tune.search import InfrastructureError
from . import cache as cli_cache
from . import kernels as cli_kernels
from . import model as cli_model
from . import tuning as cli_tuning
from . import workers as cli_workers
from .args import (
    HelpFormatter,
    add_causal,
    add_database,
    nonnegative_int,
    positive_float,
    positive_int,
)
from .build_table import build_table
from .progress import progress
from .table import render_table

EXIT_USAGE = 2


class UsageError(Exception):
    pass


# -- selecting configs --------------------------------------------------------------------------


def _parse_value(text: str) -> Value:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(text)
    except ValueError:
        return text


def _read_config_arg(arg: str) -> list[Config]:
    """A JSON config, a JSON list of configs, or @path to a file holding either."""
    where = arg[1:] if arg.startswith("@") else "--config"
    try:
        data = read_json(where) if arg.startswith("@") else loads_json(arg, where)
    except JsonInputError as exc:
        raise UsageError(str(exc)) from None
    items = data if isinstance(data, list) else [data]
    configs: list[Config] = []
    for i, item in enumerate(items):
        try:
            config = Config.from_dict(item)
            configs.append(load_space(config.family).validate(config))
        except InvalidConfig as exc:
            raise UsageError(f"{where}: config #{i} refused: " + "; ".join(exc.reasons)) from None
    return configs


def select_configs(args: argparse.Namespace, target: Target) -> list[Config]:
    if args.config:
        return [c for arg in args.config for c in _read_config_arg(arg)]
    space = load_space(args.family)
    pins: dict[str, Value] = {}
    for item in args.set or []:
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--set takes NAME=VALUE, got {item!r}")
        pins[name.strip()] = _parse_value(value.strip())
    problem_axes: dict[str, list[Value]] = {
        "head_dim": args.head_dim or [],
        "dtype": args.dtype or [],
        "causal": {"false": [False], "true": [True], "both": []}[args.causal],  # type: ignore[dict-item]
    }
    configs: list[Config] = []
    try:
        combos = [{}]  # type: list[dict[str, Value]]
        for name, values in problem_axes.items():
            if values:
                combos = [{**c, name: v} for c in combos for v in values]
        for combo in combos:
            configs += space.valid_configs(target, {**pins, **combo})
    except InvalidConfig as exc:
        raise UsageError("; ".join(exc.reasons)) from None
    configs = sorted(set(configs), key=lambda c: space.name_of(c))
    if args.sample is not None and args.sample < len(configs):
        configs = sorted(
            random.Random(args.seed).sample(configs, args.sample), key=lambda c: space.name_of(c)
        )
    if args.limit is not None:
        configs = configs[: args.limit]
    return configs


# -- compile ------------------------------------------------------------------------------------


def _build_json(result: BuildResult) -> dict[str, Any]:
    return {
        "name": load_space(result.config.family).name_of(result.config),
        "config": result.config.as_dict(),
        "status": result.status,
        "message": result.message,
        "cached": result.cached,
        "compile_seconds": round(result.seconds, 3),
        "ptxas": result.ptxas.as_dict() if result.ptxas else None,
        "launch_info": result.launch_info.as_dict() if result.launch_info else None,
        "cubin": str(result.cubin) if result.cubin else None,
    }


def _resolve_target(args: argparse.Namespace) -> Target:
    return target_for_arch(args.arch) if args.arch else default_target()


def _compile(
    configs: list[Config], target: Target, args: argparse.Namespace
) -> tuple[list[BuildResult], float]:
    jobs = args.jobs or default_jobs()
    start = time.perf_counter()
    with progress(len(configs), f"compile ({jobs} jobs)", not args.quiet) as bar:

        def tick(result: BuildResult) -> None:
            bar.update(1)
            bar.set_postfix_str(f"{result.status}")

        results = compile_many(configs, target, jobs=jobs, force=args.force, on_result=tick)
    return results, time.perf_counter() - start


def _host_info(jobs: int) -> dict[str, Any]:
    tools = toolchain()
    return {
        "host": platform.node(),
        "host_cores": os.cpu_count(),
        "jobs": jobs,
        "nvcc": tools.nvcc_version,
        "cutlass": tools.cutlass_version,
    }


def _selection(args: argparse.Namespace) -> tuple[Target, list[Config]] | None:
    """The target and the configs the command line selects (None, said, when none match)."""
    target = _resolve_target(args)
    configs = select_configs(args, target)
    if not configs:
        print("no config matches the selection", file=sys.stderr)
        return None
    return target, configs


def cmd_compile(args: argparse.Namespace) -> int:
    selected = _selection(args)
    if selected is None:
        return 1
    target, configs = selected
    results, wall = _compile(configs, target, args)
    print(build_table(results))
    built = [r for r in results if r.ok and not r.cached]
    ok = sum(r.ok for r in results)
    per_min = 60 * len(built) / wall if built and wall > 0 else 0.0
    print(
        f"\n{ok}/{len(results)} built for {target.arch} "
        f"({sum(r.cached for r in results)} from cache, {len(built)} compiled in {wall:.1f} s"
        f"{f', {per_min:.1f} configs/min' if built else ''}); "
        f"{sum(r.status is Status.INVALID for r in results)} pruned, "
        f"{sum(r.status in (Status.COMPILE_ERROR, Status.TIMEOUT) for r in results)} failed, "
        f"{sum(r.status is Status.INFRASTRUCTURE for r in results)} not compiled (compile "
        "workers died); "
        f"{sum(bool(r.ptxas and r.ptxas.spills) for r in results)} spill, "
        f"{sum(bool(r.ptxas and r.ptxas.wgmma_serialized) for r in results)} wgmma-serialized"
    )
    if args.json:
        payload = {
            **_host_info(args.jobs or default_jobs()),
            "arch": target.arch,
            "wall_seconds": round(wall, 2),
            "compiled_now": len(built),
            "configs_per_minute": round(per_min, 2),
            "results": [_build_json(r) for r in results],
        }
        Path(args.json).write_text(json.dumps(payload, indent=1))
    return 0 if all(r.ok or r.status is Status.INVALID for r in results) else 1


# -- check --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Validation:
    """One config's line of `cute-autotune check`: the validator's report, or why none."""

    status: Status  # PASSED, FAILED, NOT_RUN (the build failed), or how the worker failed
    reason: str
    report: ValidationReport | None = None
    traceback: str = ""

    @classmethod
    def of(cls, reply: ValidationReport | WorkerFailure) -> Validation:
        if isinstance(reply, WorkerFailure):
            return cls(reply.status, reply.reason, traceback=reply.traceback)
        return cls(Status.PASSED if reply.passed else Status.FAILED, reply.summary(), reply)

    @property
    def worst_rel_err(self) -> float:
        return self.report.worst_rel_err if self.report is not None else math.nan

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"status": self.status, "reason": self.reason}
        if self.report is not None:
            data["report"] = self.report.as_dict()
        if self.traceback:
            data["traceback"] = self.traceback
        return data


def cmd_check(args: argparse.Namespace) -> int:
    from ..measure.protocol import ValidateRequest
    from ..measure.worker import GpuWorker

    if not gpu_available():
        print(
            "cute-autotune check needs a CUDA GPU and none is visible here. "
            "`cute-autotune compile` builds and statically checks the same configs.",
            file=sys.stderr,
        )
        return EXIT_USAGE
    import torch

    selected = _selection(args)
    if selected is None:
        return 1
    target, configs = selected
    builds, wall = _compile(configs, target, args)
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    outcomes: list[Validation] = []
    with (
        GpuWorker(torch.cuda.current_device()) as worker,
        progress(len(builds), "validate", not args.quiet) as bar,
    ):
        for i, build in enumerate(builds):
            if build.ok:  # the validation of measure.trial, in the worker
                outcomes.append(
                    Validation.of(
                        worker.request(ValidateRequest(build, seed + i), timeout=args.timeout)
                    )
                )
            else:
                outcomes.append(Validation(Status.NOT_RUN, f"{build.status}: {build.message}"))
            bar.update(1)
    rows, failures, spilling, serialized = [], [], [], []
    for build, outcome in zip(builds, outcomes, strict=True):
        name = load_space(build.config.family).name_of(build.config)
        worst = outcome.worst_rel_err
        if build.ptxas and build.ptxas.spills:
            spilling.append(
                {
                    "name": name,
                    "spill_stores": build.ptxas.spill_store_bytes,
                    "spill_loads": build.ptxas.spill_load_bytes,
                    "registers": build.ptxas.registers,
                }
            )
        if build.ptxas and build.ptxas.wgmma_serialized:
            serialized.append({"name": name, "reason": build.ptxas.wgmma_serialized})
        if build.status is not Status.INVALID and outcome.status is not Status.PASSED:
            failures.append(
                {
                    "name": name,
                    "config": build.config.as_dict(),
                    "stage": "compile" if not build.ok else "validate",
                    "status": outcome.status,
                    "reason": outcome.reason,
                }
            )
        rows.append(
            [
                name,
                build.status,
                build.ptxas.registers if build.ptxas else "",
                f"{build.ptxas.spill_store_bytes}/{build.ptxas.spill_load_bytes}"
                if build.ptxas
                else "",
                outcome.status,
                f"{worst:.2e}" if worst == worst else "",
                "" if outcome.status is Status.PASSED else outcome.reason[:120],
            ]
        )
    print(
        render_table(
            ["config", "build", "regs", "spill st/ld", "validation", "worst rel", "reason"], rows
        )
    )
    valid = [b for b in builds if b.status is not Status.INVALID]
    passed = sum(o.status is Status.PASSED for o in outcomes)
    gpu = torch.cuda.get_device_name()
    print(
        f"\n{gpu}: {len(valid)} valid, {sum(b.ok for b in builds)} compiled, {passed} passed, "
        f"{len(failures)} failed, {len(spilling)} spill, {len(serialized)} wgmma-serialized "
        f"(seed {seed})"
    )
    if args.json:
        payload = {
            "gpu": gpu,
            "arch": target.arch,
            **_host_info(args.jobs or default_jobs()),
            "command": " ".join(["cute-autotune", *sys.argv[1:]]),
            "seed": seed,
            "considered": len(builds),
            "valid": len(valid),
            "compiled": sum(b.ok for b in builds),
            "passed": passed,
            "spilling": spilling,
            "wgmma_serialized": serialized,
            "failures": failures,
            "compile_wall_seconds": round(wall, 2),
            "worker_restarts": worker.restarts,
            "results": [
                {**_build_json(b), "validation": o.as_dict()}
                for b, o in zip(builds, outcomes, strict=True)
            ],
        }
        Path(args.json).write_text(json.dumps(payload, indent=1))
    return 0 if passed == len(valid) else 1


# -- space --------------------------------------------------------------------------------------


def cmd_space(args: argparse.Namespace) -> int:
    space = load_space(args.family)
    target = _resolve_target(args)
    print(f"{space.family}: {space.description}\n")
    print(
        render_table(
            ["parameter", "role", "values", "meaning"],
            [
                [p.name, p.role, ", ".join(map(str, p.values)), p.doc]
                for p in space.params.values()
            ],
        )
    )
    print("\nconstraints:")
    for c in space.constraints:
        print(f"  {c.expr}\n      {c.message}")
    rows = []
    for d in space.params["head_dim"].values:
        for dtype in space.params["dtype"].values:
            counts = [
                len(space.valid_configs(target, {"head_dim": d, "dtype": dtype, "causal": c}))
                for c in (False, True)
            ]
            rows.append([d, dtype, counts[0], counts[1]])
    print(f"\nvalid configs on {target.name} ({target.max_smem_per_block} B smem per block):")
    print(render_table(["head_dim", "dtype", "full", "causal"], rows))
    return 0


# -- demo -------------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job (autotune/demo.py): static analysis and builds everywhere; on a GPU a short
    tuning session, the best config and a tuned attention call."""
    from . import demo

    return demo.run(args.head_dim, args.causal == "true", args.trials, args.db, gpu_available())


# -- entry point --------------------------------------------------------------------------------


def _add_selection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--family", default="sm80", help="kernel family")
    p.add_argument(
        "--config",
        action="append",
        help="a config as JSON, or @file.json holding one or a list (repeatable)",
    )
    p.add_argument("--head-dim", type=positive_int, nargs="+", help="head dims (default: all)")
    p.add_argument("--dtype", nargs="+", choices=["fp16", "bf16"], help="dtypes (default: both)")
    add_causal(
        p, default="both", both=True, help="which masks: full (false), causal (true) or both"
    )
    p.add_argument(
        "--set",
        action="append",
        metavar="NAME=VALUE",
        help="pin a parameter, e.g. --set block_m=128 (repeatable)",
    )
    p.add_argument(
        "--sample", type=positive_int, help="a random sample of this many valid configs"
    )
    p.add_argument(
        "--seed", type=nonnegative_int, help="seed for --sample and for validation inputs"
    )
    p.add_argument("--limit", type=positive_int, help="at most this many configs")
    p.add_argument("--arch", help="target, e.g. sm_90 (default: the visible GPU, else sm_90)")
    p.add_argument(
        "--jobs", type=positive_int, help="parallel nvcc processes (default: all cores)"
    )
    p.add_argument("--force", action="store_true", help="rebuild even when cached")
    p.add_argument("--json", help="write full results to this JSON file")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    from .._version import VERSION  # not importlib.metadata: a source checkout has no metadata

    parser = argparse.ArgumentParser(
        prog="cute-autotune",
        formatter_class=HelpFormatter,
        description="Autotuning explorer for CuTe FlashAttention-forward kernels.",
    )
    parser.add_argument("--version", action="version", version=f"cute-autotune {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("compile", help="build configs (or a whole space) into cubins")
    _add_selection(p)
    p.set_defaults(func=cmd_compile)
    p = sub.add_parser("check", help="build and validate configs on the GPU")
    _add_selection(p)
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=120.0,
        help="seconds one config's validation may take before it counts as a hang",
    )
    p.set_defaults(func=cmd_check)
    p = sub.add_parser(
        "demo",
        help="the main job: static analysis and a build of each "
        "family's default; on a GPU a short tuning session, the best config and "
        "a tuned attention() call against torch SDPA",
    )
    p.add_argument(
        "--head-dim",
        type=int,
        default=128,
        choices=[64, 128],
        help="head dim of the demo's problem (B4 H16 L2048 fp16)",
    )
    add_causal(p, default="false", both=False, help="a causal mask")
    p.add_argument(
        "--trials", type=positive_int, default=6, help="tuning trials per kernel family"
    )
    add_database(p)
    p.set_defaults(func=cmd_demo)
    cli_tuning.register(sub)
    cli_workers.register(sub)
    cli_kernels.register(sub)
    cli_cache.register(sub)
    cli_model.register(sub)
    p = sub.add_parser("space", help="show a family's search space and its valid-config counts")
    p.add_argument("--family", default="sm80", help="kernel family")
    p.add_argument("--arch", help="target, e.g. sm_90 (default: the visible GPU, else sm_90)")
    p.set_defaults(func=cmd_space)
    for command in sub.choices.values():
        command.formatter_class = HelpFormatter
    return parser


def _one_line(text: str) -> str:
    lines = [for_terminal(line.strip()) for line in str(text).strip().splitlines() if line.strip()]
    return " ".join(lines) if len(lines) <= 3 else f"{' '.join(lines[:3])} ..."


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Every error a user can meet (bad input, a file or database that cannot
    be used, a missing toolchain) is one line on stderr and exit status 2, not a traceback."""
    from sqlalchemy.exc import SQLAlchemyError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"cute-autotune: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (
        InvalidConfig,
        ToolchainError,
        ValueError,
        StoreError,
        CacheNotWritable,
        InfrastructureError,
    ) as exc:
        print(f"cute-autotune: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except SQLAlchemyError as exc:  # a database error met outside our store (Optuna's tables)
        reason = getattr(exc, "orig", None) or exc
        print(f"cute-autotune: database error: {_one_line(str(reason))}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        print(f"cute-autotune: cannot use{where}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
