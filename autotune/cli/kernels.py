"""`cute-autotune kernels pack`: the kernel pack of tuned results (build/pack.py), made on a
machine with the CUDA toolkit for GPU machines without one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._jsonfile import read_json
from .._paths import shipped_results_files
from ..build.compiler import BuildResult, default_jobs
from ..build.pack_writer import write_pack
from ..launch.launcher import prebuilt_launcher
from ..model.config import Config
from ..model.space import load_space
from ..model.target import Target, target_for_arch
from ..store.exchange import BrokenRow, parse_export
from .args import HelpFormatter, positive_int
from .build_table import build_table
from .progress import progress


def tuned_configs(paths: Sequence[Path], target: Target) -> list[Config]:
    """The kernel configs (torch's left out) of the results in `paths` (files `export` writes,
    validated as `import` validates them) tuned on GPUs of `target`'s arch, in order."""
    found: dict[Config, None] = {}
    for path in paths:
        try:
            entries = parse_export(read_json(path))
        except BrokenRow as exc:
            raise BrokenRow(f"{path}: {exc}") from None
        for entry in entries:
            config = entry.result.config
            if entry.device.compute_capability == target.cc and load_space(config.family).compiled:
                found.setdefault(config)
    return list(found)


def cmd_pack(args: argparse.Namespace) -> int:
    targets = [target_for_arch(arch) for arch in args.arch]
    paths = [Path(p) for p in args.db_json] if args.db_json else shipped_results_files()
    selections = [(target, tuned_configs(paths, target)) for target in targets]
    for target, configs in selections:
        if not configs:
            print(
                f"no kernel config of {', '.join(map(str, paths))} was tuned on a GPU of "
                f"{target.arch}",
                file=sys.stderr,
            )
    if not any(configs for _, configs in selections):
        return 1
    launcher = prebuilt_launcher()  # first: a machine that cannot build it stops before nvcc
    jobs = args.jobs or default_jobs()
    total = sum(len(configs) for _, configs in selections)
    with progress(total, f"compile ({jobs} jobs)", not args.quiet) as bar:

        def tick(result: BuildResult) -> None:
            bar.update(1)

        report = write_pack(Path(args.out), selections, launcher, jobs=jobs, on_result=tick)
    print(build_table(list(report.builds)))
    archs = ", ".join(t.arch for t in targets)
    print(
        f"\n{report.out}: {report.entries} kernels for {archs} from {total} tuned configs, "
        f"and the launcher for {launcher.describe()}"
        + (f"; {len(report.failed)} did not build and are left out" if report.failed else "")
    )
    print(
        f"install it on the GPU machine with `pip install {report.out}` (or set "
        f"CUTE_AUTOTUNE_KERNELS={report.out})"
    )
    return 1 if report.failed else 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "kernels", help="prebuilt kernels for GPU machines without the CUDA toolkit"
    )
    actions = p.add_subparsers(dest="kernels_command", required=True, help="what to do")
    p = actions.add_parser(
        "pack",
        formatter_class=HelpFormatter,
        help="compile the tuned configs of a GPU arch and write them, with the launcher "
        "extension for this Python, as a pip-installable kernel pack",
    )
    p.add_argument(
        "--arch",
        required=True,
        nargs="+",
        help="the GPUs' arch, e.g. sm_90 (the H200); several make one pack",
    )
    p.add_argument(
        "--out",
        required=True,
        help="the pack's folder (created; an earlier pack there is replaced)",
    )
    p.add_argument(
        "--db-json",
        nargs="+",
        metavar="FILE",
        help="results files written by `cute-autotune export` (default: the shipped db/*.json)",
    )
    p.add_argument(
        "--jobs", type=positive_int, help="parallel nvcc processes (default: all cores)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_pack)
