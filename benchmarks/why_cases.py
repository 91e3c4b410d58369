"""The untuned shapes issue 38 opens with, measured as a new user meets them: `attention()`
reading only the shipped `db/` results (an empty tuning database otherwise), against SDPA's
default and each SDPA backend, in the plain alternating-call check
(benchmarks/alternating_check.py), with what dispatch decided and why.

    python benchmarks/why_cases.py [--calls 40] [--json why_cases.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from alternating_check import alternating  # noqa: E402

# (what the issue says of it, the problem: B, Hq, Hkv, Lq, Lk, D, dtype, causal)
CASES = [
    ("causal with more queries than keys", (1, 32, 8, 3000, 2000, 128, "bf16", True)),
    ("causal with more queries than keys, fp16 D=64", (2, 16, 16, 1500, 1024, 64, "fp16", True)),
    ("D=96 fp16 (Phi-3-like)", (1, 32, 32, 2048, 2048, 96, "fp16", True)),
    ("non-square prefill, GQA 5", (1, 40, 8, 777, 4099, 128, "bf16", False)),
    ("non-square prefill, GQA 5, causal", (1, 40, 8, 777, 4099, 128, "bf16", True)),
    ("fp16 decode, GQA 4, Lq=8", (8, 32, 8, 8, 8192, 128, "fp16", True)),
    ("fp16 decode, GQA 8, Lq=4", (4, 64, 8, 4, 16384, 128, "fp16", True)),
    ("untuned prefill (the tune-in-a-minute case)", (3, 12, 12, 1531, 1531, 64, "fp16", True)),
]


def _compile_first(problems: list) -> None:  # type: ignore[type-arg]
    """The kernel configs dispatch chose for the cases, built together on every core before
    anything is timed (one at a time, inside the first call, they would take minutes)."""
    from autotune.build import compile_many
    from autotune.model import target_for_device
    from autotune.runtime import device_info, dispatcher

    device, target = device_info(0), target_for_device(0)
    configs = []
    for problem in problems:  # what dispatch will run, decided without building anything
        config = dispatcher().would_run(problem, device, target).config
        if config is not None and config.family != "sdpa":
            configs.append(config)
    built = compile_many(configs, target, jobs=os.cpu_count())
    print(f"built {sum(b.ok for b in built)} of {len(built)} dispatched configs first", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    os.environ.setdefault("CUTE_AUTOTUNE_DB", f"sqlite:///{tempfile.mkdtemp()}/empty.db")
    import autotune
    from autotune.model import Problem

    autotune.configure()
    problems = [Problem(*sizes) for _, sizes in CASES]
    _compile_first(problems)
    rows = []
    for (what, _), problem in zip(CASES, problems, strict=True):
        row = alternating(problem, calls=args.calls)
        row["case"] = what
        rows.append(row)
        times = row["median_us"]
        backends = " ".join(
            f"{k[5:]} {v:.1f}"
            for k, v in times.items()
            if k.startswith("sdpa_") and k != "sdpa_default"
        )
        print(
            f"{what:<46} {problem.describe():<36} ours {times['ours']:8.1f} us  SDPA "
            f"{times['sdpa_default']:8.1f} us  {row['speedup_vs_sdpa_default']:.3f}x  "
            f"({backends})  {row['dispatch'][:70]}",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
