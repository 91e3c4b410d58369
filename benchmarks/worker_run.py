"""Issue 17 on one GPU: `cute-autotune worker` draining a queue of llm-prefill items, killed
once mid-item (SIGKILL) and restarted, against a plain `cute-autotune tune` of the same items
with the same settings; the winners of both re-timed together in one process.

1. Database A (fresh SQLite): `tune --enqueue` the items; `worker --gpu 0 --lease L` in the
   background; the database is polled until an item is running with at least --kill-after
   search measurements and none of its re-ranking yet, and the worker is killed there by
   SIGKILL (its own process only: the GPU and compile processes it spawned are left to notice
   and are waited for). The queue and the trials at that moment are recorded. Once the dead
   worker's lease has run out, `worker --gpu 0 --lease L --wait` is started and drains the
   queue (the killed item first: it is the oldest). Checked: every item done, exactly one item
   taken twice (the killed one), no search measurement duplicated, no Optuna trial left
   RUNNING.
2. Database B (fresh SQLite): `tune` of the same items with the same settings.
3. Per problem, the stored best of A and of B (`cute-autotune export`) re-timed in one process
   by the plain alternating-call check (A, B, A, B, ..., the L2 flushed before each call by
   autotune.measure.timing's L2Flush, input sets rotated, CUDA events, median) and, for the
   record, in the tuner's own regime (autotune.measure.measure). Pass: every plain-check ratio
   A/B within 1 +- --tolerance; identical winners are re-timed too.

SDPA's backends are left out of the final re-ranking unless --with-sdpa: on these fp16
non-causal problems cuDNN is the stored best of most of them, which would make the comparison
of the two searches trivial.

    python benchmarks/worker_run.py --out DIR                      # on the GPU host
    python benchmarks/worker_run.py --out DIR --replay tests/data/sweep_sm90_h200.json.gz

With --replay (a CPU dry run, no GPU) the tuning runs on recorded measurements and step 3 is
NOT run: the ratios are those of the stored medians, and the summary says so ("dry_run").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# (B, Hq, Hkv, L): three of llm-prefill's shapes, all in the sm90 replay recording
PROBLEMS = ["8,16,16,1024", "4,16,16,2048", "4,32,8,2048"]


def cli(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "autotune.cli", *args]


class Run:
    """The steps' commands, their logs and times."""

    def __init__(self, out: Path, t0: float) -> None:
        self.out, self.t0 = out, t0
        self.commands: list[dict[str, Any]] = []

    def now(self) -> float:
        return round(time.time() - self.t0, 2)

    def call(self, name: str, args: list[str], timeout: float, suffix: str = ".txt") -> int:
        log = self.out / f"{name}{suffix}"
        start = self.now()
        with open(log, "w") as f:
            try:
                rc = subprocess.run(
                    cli(args), stdout=f, stderr=subprocess.STDOUT, timeout=max(1.0, timeout)
                ).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        self.commands.append(
            {
                "name": name,
                "argv": ["cute-autotune", *args],
                "rc": rc,
                "log": log.name,
                "start_s": start,
                "end_s": self.now(),
            }
        )
        print(f"[{self.now():7.1f} s] {name}: rc {rc}", flush=True)
        return rc


def db_state(path: Path) -> dict[str, Any]:
    """The queue, the measurements per problem and phase and the Optuna trials by state, read
    straight from the SQLite file (read-only; the worker may be writing)."""
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        columns = (
            "id",
            "problem_id",
            "state",
            "worker",
            "attempts",
            "message",
            "lease_until",
            "started_at",
            "finished_at",
        )
        items = [
            dict(zip(columns, r, strict=True))
            for r in con.execute(f"select {', '.join(columns)} from work_items order by id")
        ]
        measured: dict[tuple[int, str], int] = {}
        timed: dict[int, int] = {}  # search measurements that were validated and timed
        by_status: dict[str, int] = {}
        for problem_id, phase, status, n in con.execute(
            "select problem_id, phase, status, count(*) from measurements group by 1, 2, 3"
        ):
            measured[(problem_id, phase)] = measured.get((problem_id, phase), 0) + n
            if phase == "search":
                by_status[status] = by_status.get(status, 0) + n
                if status == "ok":
                    timed[problem_id] = timed.get(problem_id, 0) + n
        for item in items:
            item["search_measurements"] = measured.get((item["problem_id"], "search"), 0)
            item["search_timed"] = timed.get(item["problem_id"], 0)
            item["rerank_measurements"] = measured.get((item["problem_id"], "rerank"), 0)
        try:
            trials = dict(con.execute("select state, count(*) from trials group by 1").fetchall())
            running = con.execute(
                "select sum(exists (select 1 from trial_user_attributes a where a.trial_id = "
                "t.trial_id and a.key = 'owner')), count(*) from trials t "
                "where t.state = 'RUNNING'"
            ).fetchone()
        except sqlite3.OperationalError:  # Optuna's tables are made by the first session
            trials, running = {}, (0, 0)
        duplicated = con.execute(
            "select coalesce(sum(n - 1), 0) from (select count(*) n from measurements "
            "where phase = 'search' group by problem_id, config_id)"
        ).fetchone()[0]
        return {
            "items": items,
            "trials_by_state": trials,
            "running_trials": int(running[1] or 0),
            "running_trials_with_owner": int(running[0] or 0),
            "running_trials_without_owner": int(running[1] or 0) - int(running[0] or 0),
            "search_measurements": sum(n for (_, ph), n in measured.items() if ph == "search"),
            "search_timed": sum(timed.values()),
            "search_measurements_by_status": by_status,
            "rerank_measurements": sum(n for (_, ph), n in measured.items() if ph == "rerank"),
            "duplicated_search_measurements": int(duplicated),
        }
    finally:
        con.close()


def read_state(path: Path, tries: int = 20) -> dict[str, Any]:
    """db_state, tried again while the file is locked or recovering (a writer was killed);
    the error in words if it never reads."""
    error = ""
    for _ in range(tries):
        try:
            return db_state(path)
        except sqlite3.Error as exc:
            error = f"{type(exc).__name__}: {exc}"
            time.sleep(0.25)
    return {"error": error, "items": []}


def kill_point(state: dict[str, Any], kill_after: int) -> dict[str, Any] | None:
    """The item to kill the worker in: running, >= kill_after searched, not yet re-ranked."""
    for item in state["items"]:
        if (
            item["state"] == "running"
            and item["search_measurements"] >= kill_after
            and item["rerank_measurements"] == 0
        ):
            return dict(item)
    return None


def group_members(pgid: int) -> list[int]:
    """Live processes of a process group (Linux /proc)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def worker_argv(url: str, lease: float, replay: str | None, wait: bool) -> list[str]:
    return (
        ["worker", "--db", url, "--gpu", "0", "--lease", str(lease)]
        + (["--wait"] if wait else [])
        + (["--replay", replay] if replay else [])
    )


def killed_worker_run(
    run: Run, url: str, db: Path, args: argparse.Namespace, deadline: float
) -> dict[str, Any]:
    """Step 1 after the enqueue: the first worker, killed mid-item; the second, to the end."""
    result: dict[str, Any] = {}
    log = open(run.out / "worker_1_killed.txt", "w")
    started = run.now()
    first = subprocess.Popen(
        cli(worker_argv(url, args.lease, args.replay, False)),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    run.commands.append(
        {
            "name": "worker_1_killed",
            "argv": ["cute-autotune", *worker_argv(url, args.lease, args.replay, False)],
            "log": "worker_1_killed.txt",
            "start_s": started,
        }
    )
    point, polls = None, 0
    while time.time() < deadline and first.poll() is None:
        polls += 1
        try:
            state = db_state(db)
        except sqlite3.OperationalError:  # locked for a moment
            time.sleep(args.poll)
            continue
        point = kill_point(state, args.kill_after)
        if point is not None:
            break
        time.sleep(args.poll)
    if point is None or first.poll() is not None:
        # the worker ended (or time ran out) before an item reached the kill point
        if first.poll() is None:
            os.kill(first.pid, signal.SIGKILL)
        first.wait()
        log.close()
        result["kill"] = {
            "mid_item": False,
            "reason": "no item reached the kill point "
            f"(worker rc {first.returncode}, {polls} polls)",
            "state": read_state(db),
        }
        return result
    os.kill(first.pid, signal.SIGKILL)
    killed_at = run.now()
    first.wait()
    log.close()
    run.commands[-1].update({"rc": first.returncode, "end_s": killed_at})
    after = read_state(db)  # what the kill left, before anything else ran
    print(
        f"[{run.now():7.1f} s] worker 1 killed (SIGKILL) in item {point['id']} after "
        f"{point['search_measurements']} search measurements",
        flush=True,
    )
    # The processes the worker spawned (GPU worker, compile pool, resource tracker) see their
    # pipe close and end; they are waited for, and killed only if they do not.
    left, waited = group_members(first.pid), 0.0
    while left and waited < args.orphan_wait:
        time.sleep(0.5)
        waited += 0.5
        left = group_members(first.pid)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # ended meanwhile
            pass
    run.call("queue_after_kill", ["queue", "--db", url], 60)
    result["kill"] = {
        "mid_item": any(
            i["id"] == point["id"] and i["state"] == "running" and i["rerank_measurements"] == 0
            for i in after["items"]
        ),
        "signal": "SIGKILL",
        "worker_started_s": started,
        "killed_at_s": killed_at,
        "seconds_after_worker_start": round(killed_at - started, 2),
        "item": point["id"],
        "polls": polls,
        "state_at_kill": after,
        "spawned_processes_ended_by_themselves_s": None if left else waited,
        "spawned_processes_killed_after_wait": left,
    }
    # Wait for the dead worker's lease to run out, so the restarted worker takes the killed
    # item first (it is the oldest), as the plain tune runs the items in the same order.
    lease_until = next((i["lease_until"] for i in after["items"] if i["id"] == point["id"]), None)
    if lease_until:  # stored by SQLAlchemy as UTC, without the zone
        until = datetime.fromisoformat(lease_until)
        until = until if until.tzinfo else until.replace(tzinfo=UTC)
        pause = (until - datetime.now(UTC)).total_seconds() + 1.0
        result["kill"]["waited_for_lease_s"] = round(max(0.0, pause), 2)
        time.sleep(max(0.0, min(pause, args.lease + 1.0)))
    rc = run.call(
        "worker_2_restarted",
        worker_argv(url, args.lease, args.replay, True),
        deadline - time.time(),
    )
    final = read_state(db)
    run.call("queue_final", ["queue", "--db", url], 60)
    items = final["items"]
    result["restart"] = {"rc": rc, "state_at_end": final}
    result["checks"] = {
        "items": len(items),
        "items_done": sum(i["state"] == "done" for i in items),
        "killed_item_taken_twice": any(
            i["id"] == point["id"] and i["attempts"] == 2 for i in items
        ),
        "other_items_taken_once": all(i["attempts"] == 1 for i in items if i["id"] != point["id"]),
        "duplicated_search_measurements": final.get("duplicated_search_measurements", -1),
        "running_trials_left": final.get("running_trials", -1),
        "search_measurements_at_kill": after.get("search_measurements", -1),
        "search_measurements_at_end": final.get("search_measurements", -1),
    }
    checks = result["checks"]
    checks["ok"] = bool(
        result["kill"]["mid_item"]
        and rc == 0
        and checks["items_done"] == checks["items"] > 0
        and checks["killed_item_taken_twice"]
        and checks["other_items_taken_once"]
        and checks["duplicated_search_measurements"] == 0
        and checks["running_trials_left"] == 0
    )
    return result


def winners(export_path: Path) -> dict[str, dict[str, Any]]:
    """Stored best per problem (keyed by its JSON) of a `cute-autotune export`."""
    data = json.loads(export_path.read_text())
    return {json.dumps(r["problem"], sort_keys=True): r for r in data["results"]}


def config_name(config: dict[str, Any]) -> str:
    from autotune.model import Config, load_space

    parsed = Config.from_dict(config)
    return load_space(parsed.family).name_of(parsed)


# -- step 3, in its own process on the GPU ----------------------------------------------------


def plain_alternating(
    fns: dict[str, Any], n_sets: int, calls: int, warmup: int
) -> dict[str, dict[str, float]]:
    """Fixed order (A, B, A, B, ...), the L2 flushed before each call (a buffer twice the L2
    overwritten, then a ~50 us GPU spin so the host has issued the call before its start
    event fires), CUDA events around each call, input sets rotated; median, p20, p80 per
    candidate. Written apart from the tuner's timing code, as benchmarks/alternating_check.py
    is, to hold it to account."""
    import torch

    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    scratch = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")

    def flush() -> None:
        scratch.zero_()
        torch.cuda._sleep(100_000)

    for fn in fns.values():
        fn(0)
    torch.cuda.synchronize()
    events: dict[str, list[Any]] = {name: [] for name in fns}
    for i in range(warmup + calls):
        for name, fn in fns.items():
            flush()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn(i % n_sets)
            end.record()
            if i >= warmup:
                events[name].append((start, end))
    torch.cuda.synchronize()
    result = {}
    for name, pairs in events.items():
        us = [s.elapsed_time(e) * 1e3 for s, e in pairs]
        deciles = statistics.quantiles(us, n=10, method="inclusive")
        result[name] = {
            "median_us": statistics.median(us),
            "p20_us": deciles[1],
            "p80_us": deciles[7],
            "calls": len(us),
        }
    return result


def kernel_call(kernel: Any, sets: list[tuple[Any, ...]]) -> Any:
    return lambda i: kernel(*sets[i][:3], out=sets[i][3])


def sdpa_calls(calls: list[Any]) -> Any:
    return lambda i: calls[i]()


def retime(export_a: Path, export_b: Path, out: Path, calls: int, warmup: int) -> int:
    from autotune.build import compile_config
    from autotune.launch import CompiledKernel
    from autotune.measure import measure, problem_inputs, sdpa_call
    from autotune.model import Config, Problem, load_space

    a, b = winners(export_a), winners(export_b)
    rows = []
    for key in sorted(set(a) & set(b)):
        problem = Problem(**json.loads(key))
        sets = problem_inputs(problem)  # (q, k, v, out) per input set, as the tuner times
        fns = {}
        for name, record in (("A", a[key]), ("B", b[key])):
            config = Config.from_dict(record["config"])
            if load_space(config.family).compiled:
                build = compile_config(config)  # the carried cubin (a cache hit)
                if not build.ok:
                    raise SystemExit(
                        f"{name}'s winner of {problem.describe()} did not build: {build.message}"
                    )
                fns[name] = kernel_call(CompiledKernel(build, 0), sets)
            else:  # an SDPA backend won (--with-sdpa)
                fns[name] = sdpa_calls(
                    [
                        sdpa_call(str(config["backend"]), *s[:3], causal=problem.causal)
                        for s in sets
                    ]
                )
        n_sets = len(sets)
        plain = plain_alternating(fns, n_sets, calls, warmup)
        regime = measure(fns, n_sets=n_sets, rounds=11, round_ms=30.0)
        rows.append(
            {
                "problem": json.loads(key),
                "plain_alternating": plain,
                "regime": {k: t.as_dict() for k, t in regime.items()},
            }
        )
        ratio = plain["A"]["median_us"] / plain["B"]["median_us"]
        print(
            f"{problem.describe():<28} A {plain['A']['median_us']:8.1f} us  "
            f"B {plain['B']['median_us']:8.1f} us  A/B {ratio:.4f}",
            flush=True,
        )
    out.write_text(json.dumps({"calls": calls, "warmup": warmup, "rows": rows}, indent=1) + "\n")
    return 0


def retime_together(
    run: Run, export_a: Path, export_b: Path, calls: int, warmup: int, deadline: float
) -> dict[str, dict[str, Any]]:
    """Step 3 in its own process (this file's --retime, on GPU 0): the stored best of both
    exports re-timed together; its rows by problem key, none when it failed."""
    started, into = run.now(), run.out / "retime.json"
    with open(run.out / "retime.txt", "w") as f:
        try:
            rc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--out",
                    str(run.out),
                    "--calls",
                    str(calls),
                    "--warmup",
                    str(warmup),
                    "--retime",
                    str(export_a),
                    str(export_b),
                    str(into),
                ],
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=max(10.0, deadline - time.time()),
            ).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    run.commands.append(
        {"name": "retime", "rc": rc, "log": "retime.txt", "start_s": started, "end_s": run.now()}
    )
    print(f"[{run.now():7.1f} s] retime: rc {rc}", flush=True)
    if rc != 0:
        return {}
    return {
        json.dumps(r["problem"], sort_keys=True): r for r in json.loads(into.read_text())["rows"]
    }


# The two runs compared, as named in the summary's rows (A first, B second).
SIDES = ("a_worker", "b_plain")


def compare_winners(
    a: dict[str, dict[str, Any]],
    b: dict[str, dict[str, Any]],
    retimed: dict[str, dict[str, Any]],
    problems: list[str],
    tolerance: float,
    dry_run: bool,
    sides: tuple[str, str],
) -> list[dict[str, Any]]:
    """A row per problem: both winners, the ratio A/B (re-timed; in a dry run, of the stored
    medians) and whether it is within 1 +- tolerance."""
    rows = []
    for key in sorted(set(a) | set(b), key=lambda k: problems_order(k, problems)):
        ra, rb = a.get(key), b.get(key)
        row: dict[str, Any] = {"problem": json.loads(key)}
        for side, rec in zip(sides, (ra, rb), strict=True):
            row[side] = (
                None
                if rec is None
                else {
                    "config": rec["config"],
                    "name": config_name(rec["config"]),
                    "stored_median_us": rec["median_us"],
                    "trials": rec["trials"],
                }
            )
        row["identical_winners"] = bool(ra and rb and ra["config"] == rb["config"])
        if key in retimed:
            plain = retimed[key]["plain_alternating"]
            row["retimed"] = retimed[key]
            row["ratio_a_over_b"] = plain["A"]["median_us"] / plain["B"]["median_us"]
            regime = retimed[key]["regime"]
            row["regime_ratio_a_over_b"] = regime["A"]["median_us"] / regime["B"]["median_us"]
            row["ratio_basis"] = "re-timed: plain alternating check, medians"
        elif dry_run and ra and rb:
            row["ratio_a_over_b"] = ra["median_us"] / rb["median_us"]
            row["ratio_basis"] = "DRY RUN: stored medians of each run, NOT re-timed"
        else:
            row["ratio_a_over_b"] = None
            row["ratio_basis"] = "missing (a run or the re-timing failed)"
        ratio = row["ratio_a_over_b"]
        row["pass"] = ratio is not None and abs(ratio - 1.0) <= tolerance
        rows.append(row)
    return rows


# -- the whole run ----------------------------------------------------------------------------


def shapes_toml(path: Path, problems: list[str], head_dim: int, dtype: str) -> None:
    lines = [
        'name = "worker-run"',
        f'dtypes = ["{dtype}"]',
        f"head_dims = [{head_dim}]",
        "causal = [false]",
        "shapes = [",
    ]
    for text in problems:
        batch, hq, hkv, seqlen = (int(x) for x in text.split(","))
        lines.append(
            f"    {{ batch = {batch}, heads_q = {hq}, heads_kv = {hkv}, seqlen = {seqlen} }},"
        )
    path.write_text("\n".join([*lines, "]"]) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--problem",
        action="append",
        metavar="B,HQ,HKV,L",
        help=f"llm-prefill shapes (default: {' '.join(PROBLEMS)})",
    )
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--family", default="sm90")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--rerank-top", type=int, default=2)
    parser.add_argument(
        "--with-sdpa",
        action="store_true",
        help="let SDPA's backends into the final re-ranking (as a plain tune)",
    )
    parser.add_argument(
        "--kill-after",
        type=int,
        default=3,
        help="search measurements of the running item before the kill",
    )
    parser.add_argument("--lease", type=float, default=20.0)
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
        default=450.0,
        help="seconds for the whole run (steps are cut to fit)",
    )
    parser.add_argument("--replay", help="a recording: CPU dry run, step 3 not run")
    parser.add_argument("--command", default="", help="the command line, for the summary")
    parser.add_argument(
        "--retime",
        nargs=3,
        type=Path,
        metavar=("EXPORT_A", "EXPORT_B", "OUT"),
        help=argparse.SUPPRESS,
    )
    args = parser.parse_args()
    if args.retime:
        export_a, export_b, into = args.retime
        return retime(export_a, export_b, into, args.calls, args.warmup)

    t0 = time.time()
    deadline = t0 + args.until
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    run = Run(out, t0)
    problems = args.problem or PROBLEMS
    shapes_toml(out / "shapes.toml", problems, args.head_dim, args.dtype)
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
    ]
    search += [] if args.with_sdpa else ["--without-sdpa"]
    search += ["--replay", args.replay] if args.replay else []
    db_a, db_b = out / "a_worker.db", out / "b_plain.db"
    for db in (db_a, db_b):
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
    url_a, url_b = f"sqlite:///{db_a}", f"sqlite:///{db_b}"

    summary: dict[str, Any] = {
        "command": args.command or " ".join(sys.argv),
        "dry_run": bool(args.replay),
        "note": (
            "issue 17: cute-autotune worker killed once mid-item (SIGKILL) and restarted, "
            "against a plain tune of the same items; winners re-timed together"
            + (
                " -- DRY RUN on a --replay recording: nothing ran on a GPU and the winners "
                "were NOT re-timed (ratios of the stored medians)"
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
            "sdpa_finalists": args.with_sdpa,
            "kill_after_search_measurements": args.kill_after,
            "lease_s": args.lease,
            "replay": args.replay,
            "tolerance": args.tolerance,
        },
    }
    # step 1: database A through the queue, its worker killed once
    rc = run.call("enqueue", ["tune", "--enqueue", *search, "--db", url_a], 120)
    if rc == 0:
        summary["worker_run"] = killed_worker_run(run, url_a, db_a, args, deadline - 200)
    else:
        summary["worker_run"] = {"checks": {"ok": False}, "error": "enqueue failed"}
    # step 2: database B, a plain tune
    rc_b = run.call(
        "tune_plain",
        ["tune", *search, "--db", url_b, "--json", str(out / "tune_plain.json"), "--quiet"],
        deadline - 60 - time.time(),
    )
    summary["plain_tune"] = {"rc": rc_b, "state_at_end": read_state(db_b, tries=2)}
    # step 3: the winners of both, re-timed together
    for name, url in (("export_a_worker", url_a), ("export_b_plain", url_b)):
        run.call(name, ["export", "--db", url], 60, suffix=".json")
    a, b = winners(out / "export_a_worker.json"), winners(out / "export_b_plain.json")
    retimed = (
        {}
        if args.replay
        else retime_together(
            run,
            out / "export_a_worker.json",
            out / "export_b_plain.json",
            args.calls,
            args.warmup,
            deadline,
        )
    )
    rows = compare_winners(a, b, retimed, problems, args.tolerance, bool(args.replay), SIDES)
    summary["problems"] = rows
    checks = summary["worker_run"].get("checks", {})
    summary["pass"] = bool(
        checks.get("ok")
        and rc_b == 0
        and len(rows) == len(problems)
        and all(r["pass"] for r in rows)
    )
    summary["commands"] = run.commands
    summary["wall_s"] = run.now()
    (out / "worker_kill_restart.json").write_text(json.dumps(summary, indent=1) + "\n")
    print_table(summary)
    return 0 if summary["pass"] else 1


def problems_order(key: str, problems: list[str]) -> int:
    p = json.loads(key)
    text = f"{p['batch']},{p['heads_q']},{p['heads_kv']},{p['seqlen_q']}"
    return problems.index(text) if text in problems else len(problems)


def print_table(summary: dict[str, Any]) -> None:
    run = summary["worker_run"]
    kill = run.get("kill", {})
    checks = run.get("checks", {})
    at = kill.get("state_at_kill", {})
    print()
    if summary["dry_run"]:
        print("DRY RUN (--replay): no GPU, winners NOT re-timed; ratios of stored medians")
    print(
        f"kill: SIGKILL {kill.get('seconds_after_worker_start')} s after worker start, in item "
        f"{kill.get('item')} (mid-item: {kill.get('mid_item')}); at the kill: "
        f"{at.get('search_measurements')} search measurements, queue "
        + ", ".join(
            f"{i['id']}:{i['state']}({i['search_measurements']})" for i in at.get("items", [])
        )
    )
    print(
        f"after restart: {checks.get('items_done')}/{checks.get('items')} items done, killed "
        f"item taken twice: {checks.get('killed_item_taken_twice')}, others once: "
        f"{checks.get('other_items_taken_once')}, duplicated measurements: "
        f"{checks.get('duplicated_search_measurements')}, RUNNING trials left: "
        f"{checks.get('running_trials_left')}, search measurements "
        f"{checks.get('search_measurements_at_kill')} -> "
        f"{checks.get('search_measurements_at_end')}"
    )
    print_rows(summary["problems"], SIDES, ("A (worker) winner", "B (plain) winner"))
    print(
        f"worker checks ok: {checks.get('ok')}; overall pass: {summary['pass']}; "
        f"wall {summary['wall_s']} s"
    )


def print_rows(
    rows: list[dict[str, Any]], sides: tuple[str, str], titles: tuple[str, str]
) -> None:
    """The winners of both runs per problem, their times and ratio (compare_winners' rows)."""
    print(
        f"{'problem':<24} {titles[0]:<58} {titles[1]:<58} {'A us':>8} {'B us':>8} {'A/B':>7}  pass"
    )
    for row in rows:
        p = row["problem"]
        shape = f"B{p['batch']} H{p['heads_q']}/{p['heads_kv']} L{p['seqlen_q']}"
        a, b = row[sides[0]], row[sides[1]]
        if "retimed" in row:
            plain = row["retimed"]["plain_alternating"]
            a_us, b_us = plain["A"]["median_us"], plain["B"]["median_us"]
        else:
            a_us = a["stored_median_us"] if a else float("nan")
            b_us = b["stored_median_us"] if b else float("nan")
        ratio = row["ratio_a_over_b"]
        print(
            f"{shape:<24} {(a or {}).get('name', '-'):<58} {(b or {}).get('name', '-'):<58} "
            f"{a_us:8.1f} {b_us:8.1f} {ratio if ratio is not None else float('nan'):7.4f}"
            f"  {'yes' if row['pass'] else 'NO'}"
            + ("  (same config)" if row["identical_winners"] else "")
        )


if __name__ == "__main__":
    sys.exit(main())
