"""Issue 38, item 3: when dispatch picks a torch SDPA backend, the call costs what calling torch
directly costs. Per head dim (64, 96, 128, 256), a prefill and a decode problem in both layouts,
dispatch reading a scratch database whose best config of each problem is torch SDPA's default
(as a tuned SDPA win is stored), timed against `F.scaled_dot_product_attention` called directly
in the plain alternating check (benchmarks/alternating_check.py), plus the CUDA kernels each
call launched (torch's profiler): the same kernels, no copy of the inputs. Per row too, the
host's time per call (`host_us`: calls issued back to back, no synchronisation inside the loop;
the direct call of a blhd caller transposes in and out as `attention` must), since the plain
check's GPU spin hides host time only up to its own length; `--profile FILE` writes Python's
profile of the smallest decode call through dispatch.

    python benchmarks/sdpa_through_dispatch.py [--calls 60] [--json OUT.json] [--profile F]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

HEAD_DIMS = (64, 96, 128, 256)


def problems() -> list[tuple[str, Any]]:
    """(layout, problem): per head dim, a causal prefill and two GQA decode steps (8191 keys,
    and 401, a call of a few microseconds on the GPU), bf16 and fp16 alternating by head dim,
    each in both layouts."""
    from autotune.model import Problem

    found: list[tuple[str, Any]] = []
    for i, dim in enumerate(HEAD_DIMS):
        dtype = "bf16" if i % 2 else "fp16"
        for problem in (
            Problem(2, 16, 16, 2047, 2047, dim, dtype, True),
            Problem(8, 32, 8, 1, 8191, dim, dtype, True),
            Problem(8, 40, 10, 1, 401, dim, dtype, True),
        ):
            found.extend((layout, problem) for layout in ("bhld", "blhd"))
    return found


def scratch_results(device: Any, chosen: list[Any]) -> dict[str, Any]:
    """An export document whose best config of each problem is SDPA's default."""
    entries = []
    for problem in chosen:
        # A plausible time (300 TFLOP/s or 2 TB/s): an import refuses impossible ones.
        us = max(problem.flops / 300e6, problem.bytes / 2e3)
        config = {"family": "sdpa", "backend": "default", **problem.space_values()}
        entries.append(
            {
                "device": {
                    "name": device.name,
                    "compute_capability": device.compute_capability,
                    "sm_count": device.sm_count,
                    "driver_version": device.driver_version,
                    "cuda_version": device.cuda_version,
                },
                "problem": problem.as_dict(),
                "family": "sdpa",
                "config": config,
                "median_us": us,
                "tflops": problem.tflops(us),
                "sdpa_default_us": us,
                "sdpa_flash_us": None,
                "trials": 0,
                "study": "sdpa-through-dispatch",
                "source": "imported",
            }
        )
    return {"format": "cute-autotune-results", "version": 1, "results": entries}


def _kernels(fn: Any) -> list[str]:
    """Names of the CUDA kernels one call of `fn` launches (after a warm call)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted(e.name for e in prof.events() if e.device_type.name == "CUDA")


def _host_us(fn: Any, calls: int = 300) -> float:
    """Median over 5 rounds of the host's microseconds per call, `calls` issued back to back."""
    import statistics
    import time

    import torch

    rounds = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(rounds)


def _profile(fn: Any, path: str, calls: int = 300) -> None:
    """Python's profile of `calls` calls of `fn`, the 30 costliest functions, to `path`."""
    import cProfile
    import io
    import pstats

    fn()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    Path(path).write_text(text.getvalue())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--profile", help="write the profile of the smallest call here")
    args = parser.parse_args()
    scratch = f"sqlite:///{tempfile.mkdtemp()}/sdpa.db"
    os.environ["CUTE_AUTOTUNE_DB"] = scratch
    import torch
    from alternating_check import _sdpa, alternating

    import autotune
    from autotune.runtime import device_info
    from autotune.store import TuningStore

    chosen = problems()
    TuningStore(scratch).import_results(
        scratch_results(device_info(0), sorted({p for _, p in chosen}, key=str))
    )
    autotune.configure(db=scratch, use_shipped=False)
    rows = []
    print(
        f"{'problem':<40} {'layout':<6} {'through dispatch':>17} {'SDPA':>9}  ratio "
        "(p20-p80)  same kernels  host us (ours / direct / direct+transposes)"
    )
    for layout, problem in chosen:
        row = alternating(problem, calls=args.calls, layout=layout)
        q, k, v = (
            torch.randn(
                problem.batch,
                length,
                heads,
                problem.head_dim,
                device="cuda",
                dtype={"fp16": torch.float16, "bf16": torch.bfloat16}[problem.dtype],
            )
            for heads, length in (
                (problem.heads_q, problem.seqlen_q),
                (problem.heads_kv, problem.seqlen_k),
                (problem.heads_kv, problem.seqlen_k),
            )
        )
        if layout == "bhld":
            q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        qb, kb, vb = (t if layout == "bhld" else t.transpose(1, 2) for t in (q, k, v))
        ours = _kernels(
            lambda q=q, k=k, v=v, layout=layout, problem=problem: autotune.attention(
                q, k, v, causal=problem.causal, layout=layout
            )
        )
        direct_call = _sdpa(qb, kb, vb, problem.causal, None)
        direct = _kernels(direct_call)

        def through(
            q: Any = q, k: Any = k, v: Any = v, layout: str = layout, causal: bool = problem.causal
        ) -> Any:
            return autotune.attention(q, k, v, causal=causal, layout=layout)

        def caller(
            q: Any = q,
            k: Any = k,
            v: Any = v,
            call: Any = direct_call,
            layout: str = layout,
            causal: bool = problem.causal,
        ) -> Any:
            if layout == "bhld":
                return call()
            return _sdpa(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal, None
            )().transpose(1, 2)

        host = {
            "through_dispatch": _host_us(through),
            "direct": _host_us(direct_call),
            "direct_with_transposes": _host_us(caller),
        }
        if (
            args.profile
            and problem.seqlen_k == 401
            and layout == "blhd"
            and problem.head_dim == 128
        ):
            _profile(through, args.profile)
        ratio = row["ratio_vs_sdpa_default"]["ours"]
        row.update(
            {
                "kernels_through_dispatch": ours,
                "kernels_direct": direct,
                "same_kernels": ours == direct,
                "host_us": host,
                "dispatch_gpu_time_over_sdpa": 1 / row["speedup_vs_sdpa_default"],
            }
        )
        rows.append(row)
        times = row["median_us"]
        print(
            f"{problem.describe():<40} {layout:<6} {times['ours']:14.1f} us "
            f"{times['sdpa_default']:6.1f} us  {row['dispatch_gpu_time_over_sdpa']:.3f} "
            f"({1 / ratio['p80']:.3f}-{1 / ratio['p20']:.3f})  {ours == direct}"
            f"  host {host['through_dispatch']:.1f} / {host['direct']:.1f} / "
            f"{host['direct_with_transposes']:.1f} us  {row['dispatch'][:40]}",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
