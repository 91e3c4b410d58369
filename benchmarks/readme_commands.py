"""Run every `cute-autotune` command of the README and docs/ as written, in a checkout, and
report what each printed: the evidence that the documented commands work on a machine without
a GPU (those that need one say so and exit 2). Commands in the replay-example blocks are run
in order with their block's setup by tests/test_readme_replay.py, which compares their whole
output; here they run too, without the setup, so that their exit status on a fresh clone is on
record.

    python benchmarks/readme_commands.py --out benchmarks/results/readme_commands_cpu.txt
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"```(\w*)\n(.*?)```", re.S)


def readme_commands(text: str) -> list[str]:
    """The `cute-autotune` command lines of the README's code blocks (continuations joined: a
    trailing backslash or an open quote; usage synopses, arguments in brackets, left out)."""
    commands: list[str] = []
    for _, body in FENCE.findall(text):
        pending = ""
        for line in body.splitlines():
            line = line.removeprefix("$ ") if not pending else line
            if pending or re.match(r"cute-autotune [a-z]", line):
                pending += " " + line.strip().rstrip("\\")
                if not line.endswith("\\") and pending.split("  #")[0].count("'") % 2 == 0:
                    command = pending.split("  #")[0].strip()
                    if " [" not in command:
                        commands.append(command)
                    pending = ""
    return commands


# Why a command that did not succeed here did not: each is the README's own precondition.
EXPECTED = {
    "needs a GPU": ("needs a CUDA GPU", "none is visible here"),
    "needs an earlier step's file": ("no tuning database", "cannot read", "No such file"),
    "refused, as the README shows": ("is not recorded in the replayed recordings",),
}


def verdict(rc: int, output: str) -> str:
    if rc == 0:
        return "ok"
    if rc == -1:
        return "stopped (still running at the time limit)"
    return next(
        (why for why, marks in EXPECTED.items() if any(m in output for m in marks)), "FAILED"
    )


def _pages() -> str:
    """README.md and the docs/ pages, one text."""
    return "\n".join(
        p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp())
    env = {**os.environ, "COLUMNS": "100", "CUTE_AUTOTUNE_DB": f"sqlite:///{scratch}/t.db"}
    (scratch / "demo").mkdir()
    lines = [
        f"# {' '.join([Path(sys.executable).name, *sys.argv])} in {REPO.name} "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})"
    ]
    failures = 0
    for command in readme_commands(_pages()):
        start = time.monotonic()
        # its own process group: a command stopped at the time limit takes its children along
        proc = subprocess.Popen(
            command.replace("/tmp/", f"{scratch}/"),
            shell=True,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            output, _ = proc.communicate(timeout=args.timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            rc, output = -1, output + f"\n(stopped after {args.timeout:.0f} s)"
        output = output.replace(f"{scratch}/", "/tmp/").strip()
        why = verdict(rc, output)
        failures += why == "FAILED"
        lines += ["", f"$ {command}", f"[rc {rc}, {time.monotonic() - start:.1f} s: {why}]"]
        shown = output.splitlines()
        lines += shown if len(shown) <= 12 else [*shown[:6], "...", *shown[-5:]]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(
        f"{len(readme_commands(_pages()))} commands, "
        f"{failures} failed other than for want of a GPU; {args.out}"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
