"""`cute-autotune bench`: tuned dispatch against torch SDPA (default and every backend that
accepts the problem) on a shape set, in one run, each output checked against SDPA's first.

Timed in the one regime of autotune.measure.timing (cold L2 before every call, calls alternating,
power-steady warm-up), through the public APIs as a user calls them: `autotune.attention`
and `F.scaled_dot_product_attention`. Each row says what dispatch ran, its speed-up over SDPA's
default, its regret (its time over the fastest candidate's: SDPA's backends included) and the
speed-up the database stored with the config, so the two can be compared."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..launch.tensors import torch_dtype
from ..model.problem import Problem


def bench_problem(problem: Problem, *, rounds: int = 7, round_ms: float = 40.0) -> dict[str, Any]:
    import torch

    from ..measure.sdpa import accepted_backends
    from ..measure.timing import input_sets_needed, measure
    from ..runtime.attention import attention, explain

    dtype = torch_dtype(problem.dtype)
    q_shape = (problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim)
    kv_shape = (problem.batch, problem.heads_kv, problem.seqlen_k, problem.head_dim)
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    n_sets = input_sets_needed(2 * (2 * math.prod(q_shape) + 2 * math.prod(kv_shape)), l2)
    sets = [
        (
            torch.randn(q_shape, device="cuda", dtype=dtype),
            torch.randn(kv_shape, device="cuda", dtype=dtype),
            torch.randn(kv_shape, device="cuda", dtype=dtype),
        )
        for _ in range(n_sets)
    ]
    decision = explain(*sets[0], causal=problem.causal)
    backends = [accepted_backends(*s, causal=problem.causal) for s in sets]
    expected = backends[0]["default"]().float()
    ours = attention(*sets[0], causal=problem.causal).float()
    rel_err = float((ours - expected).norm() / expected.norm())
    fns: dict[str, Any] = {"tuned": lambda i: attention(*sets[i], causal=problem.causal)}
    for name in backends[0]:
        fns[f"sdpa_{name}"] = lambda i, name=name: backends[i][name]()
    timings = measure(fns, n_sets=n_sets, rounds=rounds, round_ms=round_ms)
    tuned = timings["tuned"]
    row: dict[str, Any] = {
        "shape": problem.describe(),
        "problem": problem.as_dict(),
        "path": decision.path,
        "family": decision.config.family if decision.config else None,
        "config": decision.config.as_dict() if decision.config else None,
        "sdpa_backend": decision.sdpa_backend,
        "reason": decision.reason,
        "decided": decision.decided,
        "rel_err_vs_sdpa": rel_err,
        "tflops": problem.tflops(tuned.median_us),
        "gbytes_per_s": problem.gbytes_per_s(tuned.median_us),
        "median_us": tuned.median_us,
        "p20_us": tuned.p20_us,
        "p80_us": tuned.p80_us,
        "calls": tuned.rounds,
        "sm_clock_mhz": tuned.sm_clock_mhz,
        "power_w": tuned.power_w,
        "stored_speedup_vs_sdpa_default": decision.speedup_vs_sdpa,
    }
    for name, t in timings.items():
        if name.startswith("sdpa_"):
            row[f"{name}_tflops"] = problem.tflops(t.median_us)
            row[f"{name}_us"] = t.median_us
    row["speedup_vs_sdpa_default"] = row["sdpa_default_us"] / row["median_us"]
    row["regret"] = tuned.median_us / min(t.median_us for t in timings.values())
    return row


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "rows": rows,
        "geomean_vs_sdpa_default": geomean([r["speedup_vs_sdpa_default"] for r in rows]),
        "worst_vs_sdpa_default": min(
            (r["speedup_vs_sdpa_default"] for r in rows), default=math.nan
        ),
        "rows_per_family": {
            f: sum(str(r.get("family")) == f for r in rows)
            for f in sorted({str(r.get("family")) for r in rows})
        },
        "geomean_vs_sdpa_flash": geomean(
            [r["sdpa_flash_us"] / r["median_us"] for r in rows if r.get("sdpa_flash_us")]
        ),
        "worst_regret": max((r["regret"] for r in rows if "regret" in r), default=math.nan),
        "rows_per_path": {
            p: sum(str(r.get("path")) == p for r in rows)
            for p in sorted({str(r.get("path")) for r in rows})
        },
        "sdpa_winners": sum(bool(r.get("sdpa_backend")) for r in rows),
    }


def plot(data: dict[str, Any], path: Path, title: str) -> bool:
    """Bar groups of TFLOP/s per shape and the speed-up line; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = data["rows"]
    series = [
        ("tuned", "tflops"),
        ("SDPA default", "sdpa_default_tflops"),
        ("SDPA FLASH", "sdpa_flash_tflops"),
    ]
    fig, ax = plt.subplots(figsize=(max(8, 0.6 * len(rows) + 3), 5))
    width = 0.8 / len(series)
    for i, (label, key) in enumerate(series):
        xs = [j + (i - 1) * width for j in range(len(rows))]
        ax.bar(xs, [r.get(key) or 0 for r in rows], width, label=label)
    ax.set_ylabel("TFLOP/s")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["shape"] for r in rows], rotation=75, ha="right", fontsize=7)
    twin = ax.twinx()
    twin.plot(
        range(len(rows)),
        [r["speedup_vs_sdpa_default"] for r in rows],
        "k.-",
        label="speed-up vs SDPA default",
    )
    twin.axhline(1.0, color="gray", lw=0.8, ls="--")
    twin.set_ylabel("speed-up vs SDPA default")
    ax.set_title(
        f"{title} (geomean speed-up vs SDPA default {data['geomean_vs_sdpa_default']:.2f}x)"
    )
    handles = ax.get_legend_handles_labels()
    extra = twin.get_legend_handles_labels()
    ax.legend(handles[0] + extra[0], handles[1] + extra[1], loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
