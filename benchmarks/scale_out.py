"""Issue 18 item 1 on a host with two GPUs: `cute-autotune worker --gpus all` against one
worker over the same llm-prefill items, one of the two workers killed mid-item (SIGKILL) and
its item finished by the other; the winners of both runs re-timed together.

1. The items: llm-prefill at sm90, D=128, fp16, non-causal (all eight shapes; the cubin pack
   sm90_d128_fp16_full holds every valid config of it, built before the runs), largest first
   so that the two workers' last items end close together. `tune --enqueue --no-reuse` with a
   fixed trial budget into two fresh SQLite databases (B's items for the GPU model A's were
   enqueued for, `--for-gpu`, so the GPUs are probed once). `--no-reuse` only forbids serving a
   config from a measurement of an earlier study of the same problem; with fresh databases there
   is none, so it changes nothing here except that nothing could have been.
2. Database A: `worker --gpu 0` until the queue is drained.
3. Database B: `worker --gpus all --wait` (a worker process per GPU). The database is polled;
   once no item is left queued (each worker on its last item) and a running item has at least
   --kill-after search measurements and no re-ranking yet, the worker process holding it (named
   in the queue as `pid N on HOST`; it must be one this script started) is killed by SIGKILL.
   The other worker, once its own item is done, waits (--wait) for the dead worker's lease to
   run out, takes the item again and completes its trial budget. The kill comes in the last
   round because a worker killed earlier leaves the rest of the queue to one GPU: the run
   would then time one GPU, not two. Its cost (the lease wait, the rest of the item on one
   GPU) is measured and stays in the speedup.
4. The stored best of A and of B per problem re-timed together in one process on GPU 0
   (worker_run.py's re-timing: A, B, A, B, ... with the L2 flushed, CUDA events, median).

Trials counted: search measurements with status "ok" (validated and timed) in the database,
so pruned, repeated, reused, failed and interrupted trials, and the re-ranking, are not.
Trials per minute: that count over the queue's window, from the first item taken to the last
item finished (work_items.started_at / finished_at, UTC, the workers' clock). Worker start-up
(imports, CUDA context) is outside the window, once per worker lifetime and paid by both runs
in parallel; the process wall times are reported too. The two-worker window includes the kill's
cost: the lease wait (the surviving worker idle until the dead worker's lease ran out) and the
rest of the killed item done by one GPU. `speedup` = two-worker trials/min (lease wait
included) over one-worker trials/min; the rate without the lease wait is reported beside it.

    python benchmarks/scale_out.py --out DIR                   # on the two-GPU host
    python benchmarks/scale_out.py --out DIR --replay tests/data/sweep_sm90_h200.json.gz

With --replay (a CPU dry run) two `worker --gpu 0 --replay` processes stand in for `--gpus
all` (which needs CUDA), the speedup is not judged and step 4 is not run ("dry_run").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import worker_run as wr  # noqa: E402

# llm-prefill's eight shapes (B, Hq, Hkv, L), largest first (FLOPs)
PROBLEMS = [
    "1,16,16,16384",
    "1,32,8,8192",
    "1,16,16,8192",
    "2,16,16,4096",
    "4,32,8,2048",
    "4,16,16,2048",
    "8,16,16,1024",
    "16,16,16,512",
]
SIDES = ("a_one_worker", "b_two_workers")
SPEEDUP_WANTED = 1.8
# Seconds of --until kept for what follows the one-worker run: the two-worker run (about half
# of it on GPUs, plus the kill's cost) and the re-timing.
AFTER_ONE_WORKER_S = 190.0


def utc(text: str | None) -> datetime | None:
    """A time stored by SQLAlchemy (UTC, without the zone)."""
    if not text:
        return None
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def descendants(roots: list[int]) -> list[int]:
    """Live descendants of `roots` (Linux /proc, by parent pid), roots excluded."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parent[int(entry.name)] = int(fields[1])
    found, frontier = [], list(roots)
    while frontier:
        children = [pid for pid, ppid in parent.items() if ppid in frontier]
        found += children
        frontier = children
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def worker_pid(name: str | None) -> int | None:
    """The pid in a worker's name (`pid N on HOST`, autotune._process)."""
    parts = (name or "").split()
    return int(parts[1]) if len(parts) >= 2 and parts[0] == "pid" and parts[1].isdigit() else None


def last_round_kill_point(state: dict[str, Any], kill_after: int) -> dict[str, Any] | None:
    """worker_run's kill point, once no item is left queued (each worker on its last item)."""
    if any(item["state"] == "queued" for item in state["items"]):
        return None
    return wr.kill_point(state, kill_after)


def window(items: list[dict[str, Any]], first_takes: dict[int, str | None]) -> dict[str, Any]:
    """The queue's window: the first item taken to the last item finished. `first_takes`: the
    started_at of items before they were taken again (a take overwrites it)."""
    starts = [t for i in items if (t := utc(first_takes.get(i["id"]) or i["started_at"]))]
    ends = [t for i in items if (t := utc(i["finished_at"]))]
    if not starts or not ends:
        return {"first_take": None, "last_finish": None, "seconds": None}
    first, last = min(starts), max(ends)
    return {
        "first_take": first.isoformat(),
        "last_finish": last.isoformat(),
        "seconds": round((last - first).total_seconds(), 3),
    }


def ratio(x: float | None, y: float | None) -> float | None:
    return round(x / y, 3) if x and y else None


def per_minute(trials: int, seconds: float | None) -> float | None:
    return round(60.0 * trials / seconds, 2) if seconds else None


class Drain:
    """Worker processes started together on a database until they end (or the deadline);
    optionally one of them killed at the last-round kill point."""

    def __init__(self, run: wr.Run, name: str, argvs: list[list[str]], db: Path) -> None:
        self.run, self.name, self.db = run, name, db
        self.logs = [open(run.out / f"{name}_{n}.txt", "w") for n in range(len(argvs))]
        self.started = run.now()
        self.procs = [
            subprocess.Popen(
                wr.cli(argv), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            for argv, log in zip(argvs, self.logs, strict=True)
        ]
        for n, argv in enumerate(argvs):
            run.commands.append(
                {
                    "name": f"{name}_{n}",
                    "argv": ["cute-autotune", *argv],
                    "log": f"{name}_{n}.txt",
                    "start_s": self.started,
                }
            )

    def mine(self) -> list[int]:
        """Every live process this drain started, at any depth."""
        roots = [p.pid for p in self.procs if p.poll() is None]
        return roots + descendants(roots)

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def kill_mid_item(
        self, kill_after: int, poll: float, orphan_wait: float, deadline: float
    ) -> dict[str, Any]:
        """Poll until the kill point, then SIGKILL the worker process holding that item (its
        own process only: the GPU and compile processes it spawned are left to notice and are
        waited for)."""
        point, polls = None, 0
        while time.time() < deadline and self.running():
            polls += 1
            try:
                point = last_round_kill_point(wr.db_state(self.db), kill_after)
            except sqlite3.OperationalError:  # locked for a moment
                point = None
            if point is not None:
                break
            time.sleep(poll)
        if point is None:
            return {
                "mid_item": False,
                "polls": polls,
                "state": wr.read_state(self.db),
                "reason": "no item reached the kill point (every worker ended, or time ran out)",
            }
        victim = worker_pid(point["worker"])
        if victim is None or victim not in self.mine():
            return {
                "mid_item": False,
                "polls": polls,
                "item": point["id"],
                "reason": f"the item's worker {point['worker']!r} is not a process this "
                "script started; nothing killed",
            }
        spawned = descendants([victim])
        os.kill(victim, signal.SIGKILL)
        killed_at, killed_utc = self.run.now(), datetime.now(UTC)
        after = wr.read_state(self.db)  # what the kill left, before anything else changed
        print(
            f"[{self.run.now():7.1f} s] {point['worker']} killed (SIGKILL) in item "
            f"{point['id']} after {point['search_measurements']} search measurements",
            flush=True,
        )
        left, waited = spawned, 0.0
        while left and waited < orphan_wait:
            time.sleep(0.5)
            waited += 0.5
            left = [pid for pid in spawned if alive(pid)]
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # ended meanwhile
                pass
        item: dict[str, Any] = next((i for i in after["items"] if i["id"] == point["id"]), {})
        return {
            "mid_item": bool(
                item.get("state") == "running"
                and item.get("worker") == point["worker"]
                and item.get("rerank_measurements") == 0
            ),
            "signal": "SIGKILL",
            "victim": point["worker"],
            "victim_pid": victim,
            "killed_at_s": killed_at,
            "killed_at_utc": killed_utc.isoformat(),
            "seconds_after_start": round(killed_at - self.started, 2),
            "item": point["id"],
            "item_started_at": item.get("started_at"),
            "lease_until": item.get("lease_until"),
            "search_measurements_of_item": item.get("search_measurements"),
            "polls": polls,
            "state_at_kill": after,
            "spawned_processes": spawned,
            "spawned_processes_ended_by_themselves_s": None if left else waited,
            "spawned_processes_killed_after_wait": left,
        }

    def wait(self, deadline: float) -> tuple[list[int], bool]:
        """Every process to its end: their exit statuses, and whether the deadline came first
        (then every process of this drain was killed)."""
        while self.running() and time.time() < deadline:
            time.sleep(0.2)
        timed_out = self.running()
        if timed_out:
            for pid in self.mine():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        rcs = [p.wait() for p in self.procs]
        ended = self.run.now()
        for n, (log, rc) in enumerate(zip(self.logs, rcs, strict=True)):
            log.close()
            entry = next(c for c in self.run.commands if c["name"] == f"{self.name}_{n}")
            entry.update({"rc": rc, "end_s": ended, "timed_out": timed_out})
        print(
            f"[{ended:7.1f} s] {self.name}: rc {rcs}"
            + (" (past the deadline: killed)" if timed_out else ""),
            flush=True,
        )
        return rcs, timed_out


def run_summary(
    state: dict[str, Any],
    rcs: tuple[list[int], bool],
    started: float,
    ended: float,
    first_takes: dict[int, str | None],
) -> dict[str, Any]:
    """Counts, times and trials per minute of one run, from its database."""
    items = state["items"]
    trials = int(state.get("search_timed", 0))
    span = window(items, first_takes)
    by_worker: dict[str, list[int]] = {}
    for item in items:
        by_worker.setdefault(item["worker"] or "-", []).append(item["id"])
    return {
        "rc": rcs[0],
        "timed_out": rcs[1],
        "process_wall_s": round(ended - started, 2),
        "queue_window": span,
        "trials_timed": trials,
        "search_measurements": state.get("search_measurements"),
        "search_measurements_by_status": state.get("search_measurements_by_status"),
        "rerank_measurements": state.get("rerank_measurements"),
        "items": len(items),
        "items_done": sum(i["state"] == "done" for i in items),
        "items_finished_by_worker": by_worker,
        "duplicated_search_measurements": state.get("duplicated_search_measurements", -1),
        "running_trials_left": state.get("running_trials", -1),
        "trials_per_min": per_minute(trials, span["seconds"]),
        "trials_per_min_process_wall": per_minute(trials, ended - started),
        "state_at_end": state,
    }


def takeover(kill: dict[str, Any], final: dict[str, Any]) -> dict[str, Any]:
    """Who finished the killed item, when, and how long the other worker stood idle waiting for
    the dead worker's lease (0 when it was still busy with its own item when the lease ran
    out)."""
    killed = next((i for i in final["items"] if i["id"] == kill.get("item")), None)
    if killed is None:
        return {"finished_by_other": False}
    finisher, retake = killed["worker"], utc(killed["started_at"])
    own_ends = [
        t
        for i in final["items"]
        if i["worker"] == finisher
        and i["id"] != killed["id"]
        and (t := utc(i["finished_at"]))
        and retake
        and t <= retake
    ]
    # idle before the kill is the two workers' imbalance, not the lease's
    free = max([*own_ends, *[t for t in [utc(kill.get("killed_at_utc"))] if t]], default=None)
    lease_until = utc(kill.get("lease_until"))
    finished = utc(killed["finished_at"])
    return {
        "item": killed["id"],
        "problem_id": killed["problem_id"],
        "state": killed["state"],
        "attempts": killed["attempts"],
        "message": killed["message"],
        "killed_worker": kill.get("victim"),
        "finished_by": finisher,
        "finished_by_other": bool(
            killed["state"] == "done"
            and killed["attempts"] == 2
            and finisher
            and finisher != kill.get("victim")
        ),
        "taken_again_at": killed["started_at"],
        "finished_at": killed["finished_at"],
        "lease_until_at_kill": kill.get("lease_until"),
        "taken_again_after_lease_s": round((retake - lease_until).total_seconds(), 2)
        if retake and lease_until
        else None,
        "other_worker_free_at": free.isoformat() if free else None,
        "lease_wait_s": round(max(0.0, (retake - free).total_seconds()), 2)
        if retake and free
        else None,
        "rest_of_item_s": round((finished - retake).total_seconds(), 2)
        if finished and retake
        else None,
    }


def enqueue_both(run: wr.Run, search: list[str], url_a: str, db_a: Path, url_b: str) -> int:
    """The same items into A and B: A probes the GPU model (the GPU, or the recording), B is
    enqueued for the model stored in A's items."""
    rc = run.call("enqueue_a", ["tune", "--enqueue", *search, "--db", url_a], 120)
    if rc != 0:
        return rc
    con = sqlite3.connect(f"file:{db_a}?mode=ro", uri=True)
    try:
        name, cc, sms = con.execute(
            "select device_name, compute_capability, sm_count from work_items limit 1"
        ).fetchone()
    finally:
        con.close()
    return run.call(
        "enqueue_b",
        ["tune", "--enqueue", *search, "--for-gpu", f"{name}:{cc}:{sms}", "--db", url_b],
        120,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--problem",
        action="append",
        metavar="B,HQ,HKV,L",
        help="llm-prefill shapes (default: all eight, largest first)",
    )
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--family", default="sm90")
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--rerank-top", type=int, default=2)
    parser.add_argument(
        "--kill-after",
        type=int,
        default=20,
        help="search measurements of a last-round item before the kill",
    )
    parser.add_argument(
        "--lease",
        type=float,
        default=6.0,
        help="seconds; renewed every third of it. Short, as the lease wait is in the speedup",
    )
    parser.add_argument("--poll", type=float, default=0.05, help="seconds between DB polls")
    parser.add_argument(
        "--orphan-wait",
        type=float,
        default=30.0,
        help="seconds the killed worker's children get to end by themselves",
    )
    parser.add_argument("--calls", type=int, default=401, help="timed calls of each winner")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument(
        "--until",
        type=float,
        default=480.0,
        help="seconds for the whole run (steps are cut to fit)",
    )
    parser.add_argument(
        "--replay",
        help="a recording: CPU dry run, two `--gpu 0 --replay` "
        "workers for `--gpus all`, speedup not judged, nothing re-timed",
    )
    parser.add_argument("--command", default="", help="the command line, for the summary")
    args = parser.parse_args()

    t0 = time.time()
    deadline = t0 + args.until
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    run = wr.Run(out, t0)
    problems = args.problem or PROBLEMS
    wr.shapes_toml(out / "shapes.toml", problems, args.head_dim, args.dtype)
    search = [
        "--shapes",
        str(out / "shapes.toml"),
        "--head-dim",
        str(args.head_dim),
        "--dtype",
        args.dtype,
        "--causal",
        "false",
        "--family",
        args.family,
        "--trials",
        str(args.trials),
        "--rerank-top",
        str(args.rerank_top),
        "--without-sdpa",
        "--no-reuse",
    ]
    replay = ["--replay", args.replay] if args.replay else []
    db_a, db_b = out / "a_one_worker.db", out / "b_two_workers.db"
    for db in (db_a, db_b):
        for suffix in ("", "-wal", "-shm", ".lock"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
    url_a, url_b = f"sqlite:///{db_a}", f"sqlite:///{db_b}"
    lease = ["--lease", str(args.lease)]
    summary: dict[str, Any] = {
        "command": args.command or " ".join(sys.argv),
        "dry_run": bool(args.replay),
        "note": (
            "issue 18 item 1: the same llm-prefill items drained by one worker (GPU 0, database "
            "A) and by `worker --gpus all` on two GPUs (database B), one of the two killed by "
            "SIGKILL mid-item once no item was left queued and its item finished by the other "
            "after the lease ran out (killed in the last round: earlier, the rest of the "
            "queue would run on one GPU); trials = search measurements with status ok; "
            "trials/min over the queue window (first take to last finish; worker start-up "
            "outside it, the process wall times beside it); speedup = B's trials/min WITH the "
            "lease wait and the rest of the killed item on one GPU, over A's; --no-reuse is "
            "moot with fresh databases (nothing to reuse) and is passed as the issue asks"
            + (
                " -- DRY RUN on a --replay recording: two `worker --gpu 0 --replay` processes "
                "on a 2-core CPU stand in for `--gpus all` on two GPUs, so the speedup says "
                "nothing of GPUs and is NOT judged; winners NOT re-timed (ratios of stored "
                "medians)"
                if args.replay
                else ""
            )
        ),
        "settings": {
            "problems": problems,
            "head_dim": args.head_dim,
            "dtype": args.dtype,
            "causal": False,
            "family": args.family,
            "trials": args.trials,
            "rerank_top": args.rerank_top,
            "sdpa_finalists": False,
            "reuse": False,
            "kill_after_search_measurements": args.kill_after,
            "lease_s": args.lease,
            "replay": args.replay,
            "tolerance": args.tolerance,
            "database": "SQLite, one file per run, shared by the workers of B",
        },
    }
    rc = enqueue_both(run, [*search, *replay], url_a, db_a, url_b)
    if rc != 0:
        summary.update({"pass": False, "error": "enqueue failed", "commands": run.commands})
        (out / "scale_out_2gpu_h200.json").write_text(json.dumps(summary, indent=1) + "\n")
        return 1

    # step 2: one worker
    one = Drain(
        run, "one_worker", [["worker", "--db", url_a, "--gpu", "0", *lease, *replay]], db_a
    )
    rcs = one.wait(deadline - AFTER_ONE_WORKER_S)
    summary["one_worker"] = run_summary(wr.read_state(db_a), rcs, one.started, run.now(), {})

    # step 3: two workers, one killed mid-item
    if args.replay:  # --gpus all needs CUDA: a worker process per stand-in GPU
        argvs = [
            ["worker", "--db", url_b, "--gpu", "0", *lease, "--wait", *replay] for _ in range(2)
        ]
    else:
        argvs = [["worker", "--db", url_b, "--gpus", "all", *lease, "--wait"]]
    two = Drain(run, "two_workers", argvs, db_b)
    kill = two.kill_mid_item(args.kill_after, args.poll, args.orphan_wait, deadline - 60)
    rcs = two.wait(deadline - 60)
    final = wr.read_state(db_b)
    first_takes = {kill["item"]: kill.get("item_started_at")} if "item" in kill else {}
    two_run = run_summary(final, rcs, two.started, run.now(), first_takes)
    taken = takeover(kill, final) if kill.get("mid_item") else {"finished_by_other": False}
    wait_s = taken.get("lease_wait_s") or 0.0
    span = two_run["queue_window"]["seconds"]
    two_run["lease_wait_s"] = wait_s
    two_run["trials_per_min_without_lease_wait"] = per_minute(
        two_run["trials_timed"], span - wait_s if span else None
    )
    summary["two_workers"] = two_run
    summary["kill"], summary["takeover"] = kill, taken
    run.call("queue_final_b", ["queue", "--db", url_b], 60)

    others = [i for i in final["items"] if i["id"] != kill.get("item")]
    workers = {i["worker"] for i in final["items"]} | {kill.get("victim")}
    checks = {
        "one_worker_clean": bool(
            summary["one_worker"]["rc"] == [0]
            and summary["one_worker"]["items_done"] == summary["one_worker"]["items"] > 0
            and all(i["attempts"] == 1 for i in summary["one_worker"]["state_at_end"]["items"])
            and summary["one_worker"]["duplicated_search_measurements"] == 0
            and summary["one_worker"]["running_trials_left"] == 0
        ),
        "killed_mid_item": bool(kill.get("mid_item")),
        "killed_item_finished_by_the_other_worker": bool(taken.get("finished_by_other")),
        "two_workers_ended_in_time": not two_run["timed_out"],
        "every_item_done": two_run["items_done"] == two_run["items"] == len(problems),
        "other_items_taken_once": all(i["attempts"] == 1 for i in others),
        "two_workers_took_items": len(workers - {None, "-"}) == 2,
        "no_duplicated_search_measurement": two_run["duplicated_search_measurements"] == 0,
        "no_running_trial_left": two_run["running_trials_left"] == 0,
    }
    summary["checks"] = checks
    one_rate, two_rate = summary["one_worker"]["trials_per_min"], two_run["trials_per_min"]
    summary["speedup"] = ratio(two_rate, one_rate)
    summary["speedup_without_lease_wait"] = ratio(
        two_run["trials_per_min_without_lease_wait"], one_rate
    )
    summary["speedup_process_wall"] = ratio(
        two_run["trials_per_min_process_wall"],
        summary["one_worker"]["trials_per_min_process_wall"],
    )

    # step 4: the winners of both, re-timed together
    for name, url in (("export_a_one_worker", url_a), ("export_b_two_workers", url_b)):
        run.call(name, ["export", "--db", url], 60, suffix=".json")
    a = wr.winners(out / "export_a_one_worker.json")
    b = wr.winners(out / "export_b_two_workers.json")
    retimed = (
        {}
        if args.replay
        else wr.retime_together(
            run,
            out / "export_a_one_worker.json",
            out / "export_b_two_workers.json",
            args.calls,
            args.warmup,
            deadline,
        )
    )
    rows = wr.compare_winners(a, b, retimed, problems, args.tolerance, bool(args.replay), SIDES)
    summary["problems"] = rows
    summary["criteria"] = {
        f"speedup_at_least_{SPEEDUP_WANTED}": None
        if args.replay
        else bool(summary["speedup"] and summary["speedup"] >= SPEEDUP_WANTED),
        f"winners_within_{args.tolerance:.0%}": len(rows) == len(problems)
        and all(r["pass"] for r in rows),
        "kill_and_takeover": all(checks.values()),
    }
    summary["pass"] = all(v for v in summary["criteria"].values() if v is not None)
    summary["commands"] = run.commands
    summary["wall_s"] = run.now()
    (out / "scale_out_2gpu_h200.json").write_text(json.dumps(summary, indent=1) + "\n")
    print_table(summary)
    return 0 if summary["pass"] else 1


def print_table(summary: dict[str, Any]) -> None:
    one, two = summary["one_worker"], summary["two_workers"]
    kill, taken = summary["kill"], summary["takeover"]
    print()
    if summary["dry_run"]:
        print(
            "DRY RUN (--replay): two CPU workers for two GPUs; speedup NOT judged, winners NOT "
            "re-timed (ratios of stored medians)"
        )
    print(
        f"{'run':<12} {'items':>5} {'trials':>6} {'window s':>9} {'trials/min':>10} "
        f"{'process s':>9} {'lease wait s':>12}  items by worker"
    )
    for name, r in (("one worker", one), ("two workers", two)):
        print(
            f"{name:<12} {r['items_done']:>5} {r['trials_timed']:>6} "
            f"{r['queue_window']['seconds'] or float('nan'):>9.1f} "
            f"{r['trials_per_min'] or float('nan'):>10.1f} {r['process_wall_s']:>9.1f} "
            f"{r.get('lease_wait_s', 0.0):>12.1f}  "
            + "; ".join(f"{w}: {ids}" for w, ids in r["items_finished_by_worker"].items())
        )
    print(
        f"kill: SIGKILL of {kill.get('victim')} {kill.get('seconds_after_start')} s after the "
        f"start, in item {kill.get('item')} after {kill.get('search_measurements_of_item')} "
        f"search measurements (mid-item: {kill.get('mid_item')}); item taken again by "
        f"{taken.get('finished_by')} {taken.get('taken_again_after_lease_s')} s after the "
        f"lease ran out (lease wait {taken.get('lease_wait_s')} s), rest of it "
        f"{taken.get('rest_of_item_s')} s; finished by the other: "
        f"{taken.get('finished_by_other')}"
    )
    print("checks: " + ", ".join(f"{k} {v}" for k, v in summary["checks"].items()))
    wr.print_rows(summary["problems"], SIDES, ("A (one worker) winner", "B (two workers) winner"))
    print(
        f"speedup {summary['speedup']} (without the lease wait "
        f"{summary['speedup_without_lease_wait']}, process wall "
        f"{summary['speedup_process_wall']}); criteria: "
        + ", ".join(f"{k} {v}" for k, v in summary["criteria"].items())
        + f"; pass: {summary['pass']}; wall {summary['wall_s']} s"
    )


if __name__ == "__main__":
    sys.exit(main())
