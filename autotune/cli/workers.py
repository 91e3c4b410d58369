"""Tuning on many GPUs: `tune --enqueue` (the items), `worker` (takes and tunes the items of
its GPU model, one process per GPU with `--gpus all`) and `queue` (the items by state, worker
and age). The queue lives in the tuning database (store.queue): SQLite for the GPUs of one
host, PostgreSQL for several hosts."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

from .._shown import for_terminal
from ..measure.environment import gpu_available
from ..measure.records import DeviceInfo
from ..model.problem import Problem
from ..store.queue import QueuedItem, WorkQueue
from ..store.repo import TuningStore
from ..store.schema import default_url, describe
from ..tune.settings import SearchSettings
from .args import add_database, positive_float
from .table import render_table


def enqueue(
    db: str | None,
    device: DeviceInfo,
    problems: list[Problem],
    families: list[str],
    settings: SearchSettings,
) -> int:
    """`tune ... --enqueue`: an item per problem for the GPU model of `device`."""
    queue = WorkQueue(TuningStore(db))
    added, kept = queue.enqueue(device, problems, families, dataclasses.asdict(settings))
    print(
        f"enqueued {added} problems for {device.model} in {describe(db or default_url())}"
        + (f" ({kept} already queued)" if kept else "")
        + "; run `cute-autotune worker --db URL` on a GPU of that model to tune them"
    )
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from ..tune.tuning import open_backend
    from ..tune.worker import run_worker

    if args.gpus is not None:
        return _one_worker_per_gpu(args)
    if not args.replay and not gpu_available():
        print(
            "cute-autotune worker tunes on a CUDA GPU and none is visible here (--replay "
            "RECORDING serves recorded measurements instead).",
            file=sys.stderr,
        )
        return 2
    backend = open_backend(args.replay, device=args.gpu)
    try:
        device = backend.device()

        def started(item: QueuedItem) -> None:
            if not args.quiet:
                print(
                    f"[{device.model}] item {item.id}: {item.problem.describe()}"
                    + (f" (attempt {item.attempts})" if item.attempts > 1 else ""),
                    flush=True,
                )

        report = run_worker(args.db, backend, lease_s=args.lease, wait=args.wait, on_item=started)
    finally:
        backend.close()
    print(
        f"{report.name}: {len(report.done)} done, {len(report.failed)} failed, "
        f"{len(report.lost)} lost to another worker (lease ran out)"
    )
    for item, reason in report.failed:
        print(f"  failed: item {item.id} {item.problem.describe()}: {for_terminal(reason)}")
    return 0 if not report.failed else 1


def _one_worker_per_gpu(args: argparse.Namespace) -> int:
    """`--gpus all`: a worker process per visible GPU (each sees its own device), all to the
    end; the status is the worst of theirs."""
    import torch

    if args.gpus != "all":
        print("--gpus takes `all`", file=sys.stderr)
        return 2
    count = torch.cuda.device_count() if gpu_available() else 0
    if count == 0:
        print("--gpus all: no CUDA GPU is visible here", file=sys.stderr)
        return 2
    base = [sys.executable, "-m", "autotune.cli", "worker", "--lease", str(args.lease)]
    base += ["--db", args.db] if args.db else []
    base += ["--wait"] if args.wait else []
    base += ["--quiet"] if args.quiet else []
    procs = [
        subprocess.Popen([*base, "--gpu", str(gpu)], env=os.environ.copy()) for gpu in range(count)
    ]
    return max(p.wait() for p in procs)


def _age(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "-"
    seconds = int((now - moment).total_seconds())
    return (
        f"{seconds} s"
        if seconds < 120
        else f"{seconds // 60} min"
        if seconds < 7200
        else f"{seconds // 3600} h"
    )


def cmd_queue(args: argparse.Namespace) -> int:
    items = WorkQueue(TuningStore(args.db, create=False)).items()
    now = datetime.now(UTC)
    counts: dict[str, int] = {}
    for item in items:
        counts[item.state] = counts.get(item.state, 0) + 1
    rows: list[list[Any]] = [
        [
            item.id,
            item.problem.describe(),
            item.gpu_model,
            item.state,
            item.worker or "-",
            item.attempts,
            _age(item.enqueued_at, now),
            _age(item.started_at, now) if item.state == "running" else "-",
            item.message or "",
        ]
        for item in items
        if args.state is None or item.state == args.state
    ]
    print(
        render_table(
            [
                "item",
                "problem",
                "GPU model",
                "state",
                "worker",
                "attempts",
                "enqueued",
                "running for",
                "message",
            ],
            rows,
            movable=["GPU model", "message"],
        )
    )
    print(
        "\n"
        + (
            ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
            or "the queue is empty"
        )
        + f" in {describe(args.db or default_url())}"
    )
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "worker",
        help="take the queued tuning problems of this GPU's model "
        "(`tune --enqueue`) and tune them, until none is left",
    )
    p.add_argument("--gpu", type=int, default=0, help="the CUDA device to tune on (default: 0)")
    p.add_argument("--gpus", metavar="all", help="`all`: one worker process per visible GPU")
    p.add_argument(
        "--lease",
        type=positive_float,
        default=120.0,
        metavar="S",
        help="seconds an item stays this worker's without a renewal (renewed every "
        "third of it while it runs; a killed worker's item is taken again after it)",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="when nothing is left to take, wait while items of this GPU model are "
        "still running elsewhere (one whose worker died is taken again)",
    )
    p.add_argument(
        "--replay",
        action="append",
        metavar="RECORDING",
        help="serve measurements recorded by benchmarks/sweep.py instead of a GPU",
    )
    p.add_argument("--quiet", action="store_true", help="no line per item")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("queue", help="the queued tuning problems by state, worker and age")
    p.add_argument(
        "--state",
        choices=["queued", "running", "done", "failed"],
        help="only the items in this state",
    )
    p.set_defaults(func=cmd_queue)

    for name in ("worker", "queue"):
        add_database(sub.choices[name])
