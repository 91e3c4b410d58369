"""The decode family against torch SDPA's default on decode shapes, in effective bandwidth.

    python benchmarks/decode_bench.py --json OUT.json [--shapes llm-decode] [--extra] [--paged]

Per problem: a short search over a few decode configs x KV split counts (the flushed-alternating
regime of `autotune.measure.measure`, short rounds), then the plain alternating-call check of the
winner beside SDPA's default (ours, SDPA, ours, SDPA ..., L2 flushed before each call, median).
Effective bandwidth = bytes of K and V for the valid lengths + Q read + O written, over time. A
device-to-device copy of 4 GiB is timed in the same run; the roofline of a problem is
min(680 TFLOP/s, group x Lq FLOP per byte x the copy bandwidth). Caches are contiguous
[B, Lk, Hkv, D] ("blhd"), SDPA gets contiguous [B, H, L, D]; with --paged the same problem is
also run on a paged cache (pages of 16 and 64, shuffled; SDPA on the same keys contiguous) and
on the padded cache with per-sequence lengths spread over [Lk/2, Lk] (SDPA with the lengths as a
mask), each with its own searched config as the tuner would store it for that cache kind; the
paged rows also time the contiguous winner's config on the paged cache.

The search here is the family's own best kernel on each problem (the issue's measure); what
dispatch runs is the tuned database's choice (`cute-autotune bench`). On an sm_90 GPU every
row searches the decode90 family (the same design on wgmma + TMA) beside the decode family
(`--families` picks), and each row names the family of its winner. A decode90
winner whose splits a thread-block cluster reduces (`cluster`) is also timed in the same
alternation with its splits reduced by the combine entry instead (`combine_entry_us`).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import torch

from autotune.measure import length_mask, measure, sdpa_call
from autotune.model import Config, Problem, load_shape_set
from autotune.runtime import decode_kernel

# Off the llm-decode grid: a few query tokens (speculative decoding), GQA 16, MQA.
EXTRA = [
    Problem(8, 32, 8, 4, 32768, 128, "bf16", True),
    Problem(1, 32, 8, 8, 32768, 128, "bf16", True),
    Problem(8, 128, 8, 1, 8192, 128, "bf16", False),
    Problem(8, 128, 8, 16, 8192, 128, "bf16", True),
    Problem(16, 32, 1, 1, 16384, 128, "bf16", False),
]
PAGED = [
    Problem(8, 32, 8, 1, 32768, 128, "bf16", False),
    Problem(8, 32, 8, 16, 32768, 128, "bf16", True),
]

SPLITS = (1, 2, 4, 8, 16, 32, 64)  # the space's num_splits values
WIDE = False  # --wide
# (block_m, block_n, num_warps, kv_stages, pack_gqa): the configs that made the top 5 of the
# v2 --wide search (every 16- and 32-row config, results/decode/decode_bench_v2_h200.json) on
# 8 or more of its 41 problems, and the two MHA winners (no packing).
CANDIDATES = [
    (32, 64, 4, 3, True),
    (16, 64, 4, 3, True),
    (16, 32, 2, 3, True),
    (32, 32, 2, 3, True),
    (32, 64, 4, 2, True),
    (32, 32, 2, 2, True),
    (16, 64, 4, 2, True),
    (16, 64, 4, 4, True),
    (16, 32, 2, 2, True),
    (16, 128, 8, 3, True),
    (16, 128, 8, 2, True),
    (16, 64, 4, 3, False),
    (16, 32, 2, 3, False),
]


# (block_m, block_n, consumer_wgs, kv_stages, overlap, ctas_per_sm) of decode90: one or two
# warpgroup tiles of packed rows, the deepest rings that fit shared memory, and the one-warpgroup
# tiles small enough for two CTAs per SM.
CANDIDATES_90 = [
    (128, 128, 2, 3, True, 1),
    (128, 128, 2, 2, True, 1),
    (128, 64, 2, 4, True, 1),
    (128, 128, 2, 3, False, 1),
    (64, 128, 1, 3, True, 1),
    (64, 128, 1, 4, True, 1),
    (64, 64, 1, 4, True, 1),
    (64, 128, 1, 3, False, 1),
    (64, 64, 1, 2, True, 2),
    (64, 64, 1, 2, False, 2),
]
FAMILIES = ["decode", "decode90"]  # --families
PAGE_SIZES = (16, 64)  # the paged rows of the PAGED problems (--paged)


def configs_for(problem: Problem, kv_cache: str = "dense") -> list[Config]:
    """The configs searched for `problem` (split count 1; the splits are searched apart): the
    decode family's (every 16-row one at D=128 bf16 with --wide), and decode90's on an sm_90
    GPU where it reads the cache kind."""
    from autotune.model import load_space

    wide = WIDE and (problem.head_dim, problem.dtype) == (128, "bf16")
    configs = configs_for_decode(problem, wide) if "decode" in FAMILIES else []
    if "decode90" in FAMILIES and load_space("decode90").reads(kv_cache) and _target().cc == 90:
        configs += configs_for_decode90(problem, kv_cache)
    return configs


def configs_for_decode90(problem: Problem, kv_cache: str = "dense") -> list[Config]:
    """CANDIDATES_90 that the problem's packed rows fill (128-row tiles from 96 rows on), and
    the tile `db/` ships for the problem if it is another: the family's best known kernel is
    the tuner's, which the fixed candidates need not hold."""
    from autotune.model import load_space

    rows = problem.seqlen_q * problem.group_size
    fixed = {**problem.space_values(), "num_splits": 1}
    valid = load_space("decode90").valid_configs(_target(), fixed)
    chosen = [
        c
        for c in valid
        if (
            c["block_m"],
            c["block_n"],
            c["consumer_wgs"],
            c["kv_stages"],
            c["overlap"],
            c["ctas_per_sm"],
        )
        in CANDIDATES_90
        and (c["block_m"] == 64 or rows >= 96)
    ]
    shipped = shipped_decode90_tile(problem, kv_cache)
    return [*chosen, *(c for c in valid if _tile(c) == shipped and c not in chosen)]


def _tile(config: Any) -> tuple[Any, ...]:
    return tuple(
        config[key]
        for key in ("block_m", "block_n", "consumer_wgs", "kv_stages", "overlap", "ctas_per_sm")
    )


def shipped_decode90_tile(problem: Problem, kv_cache: str) -> tuple[Any, ...] | None:
    """The tile of the decode90 config `db/`'s shipped results hold for `problem` and cache kind
    (its split count is searched apart), or None."""
    from autotune.runtime import shipped_results

    wanted = {
        "batch": problem.batch,
        "heads_q": problem.heads_q,
        "heads_kv": problem.heads_kv,
        "seqlen_q": problem.seqlen_q,
        "seqlen_k": problem.seqlen_k,
        "head_dim": problem.head_dim,
        "dtype": problem.dtype,
        "causal": problem.causal,
        "kv_cache": kv_cache,
    }
    for result in (r for document in shipped_results() for r in document["results"]):
        if result["family"] == "decode90" and result["problem"] == wanted:
            return _tile({"ctas_per_sm": 1, **result["config"]})  # stored before it existed
    return None


def configs_for_decode(problem: Problem, wide: bool) -> list[Config]:
    """CANDIDATES, or with `wide` every valid config of 16 rows (32 too when the problem packs
    that many) with block_n <= 128, GQA packing on unless the problem is MHA."""
    from autotune.model import load_space

    space = load_space("decode")
    fixed = {**problem.space_values(), "num_splits": 1}
    valid = space.valid_configs(_target(), fixed)
    if wide:
        rows = problem.seqlen_q * problem.group_size
        return [
            c
            for c in valid
            if (c["block_m"] == 16 or (c["block_m"] == 32 and rows >= 32))
            and int(c["block_n"]) <= 128
            and (c["pack_gqa"] or problem.heads_q == problem.heads_kv)
        ]
    wanted = {(bm, bn, w, st, pk) for bm, bn, w, st, pk in CANDIDATES}
    rows = problem.seqlen_q * problem.group_size
    return [
        c
        for c in valid
        if (c["block_m"], c["block_n"], c["num_warps"], c["kv_stages"], c["pack_gqa"]) in wanted
        and (c["block_m"] == 16 or rows >= 32)
        and (c["pack_gqa"] or problem.heads_q == problem.heads_kv)
    ]


def _target() -> Any:
    from autotune.model import target_for_arch

    cc = torch.cuda.get_device_capability()
    return target_for_arch(cc[0] * 10 + cc[1])


def roofline_us(problem: Problem, copy_bw: float) -> float:
    """The issue's roofline as a time: min(680 TFLOP/s, FLOP per byte x the copy bandwidth
    `copy_bw` (TB/s) measured in the same run)."""
    return max(problem.flops / 680e12, problem.bytes / (copy_bw * 1e12)) * 1e6


def copy_tb_per_s() -> float:
    """Read + write bytes per second of a 4 GiB device-to-device copy (median of 20)."""
    src = torch.empty(2 << 30, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(23):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    return float(2 * (4 << 30) / statistics.median(times[3:]) / 1e12)


def paged(
    caches: tuple[torch.Tensor, ...], page_size: int, seed: int
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Caches [B, L, H, D] as pages [B * L / page_size, page_size, H, D] in one shuffled
    order, and the block table [B, L / page_size] that finds them."""
    batch, length, heads, dim = caches[0].shape
    per_seq = length // page_size
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(batch * per_seq, generator=gen).to(caches[0].device)
    out = []
    for cache in caches:
        pages = torch.empty(
            batch * per_seq, page_size, heads, dim, device=cache.device, dtype=cache.dtype
        )
        pages[order] = cache.reshape(batch * per_seq, page_size, heads, dim)
        out.append(pages)
    return out, order.view(batch, per_seq).to(torch.int32)


def run_problem(problem: Problem, copy_bw: float, with_pages: bool) -> list[dict[str, Any]]:
    dtype = torch.float16 if problem.dtype == "fp16" else torch.bfloat16
    b, hq, hkv, lq, lk, d = (
        problem.batch,
        problem.heads_q,
        problem.heads_kv,
        problem.seqlen_q,
        problem.seqlen_k,
        problem.head_dim,
    )
    q = torch.randn(b, lq, hq, d, device="cuda", dtype=dtype)
    k = torch.randn(b, lk, hkv, d, device="cuda", dtype=dtype)
    v = torch.randn(b, lk, hkv, d, device="cuda", dtype=dtype)
    q_s, k_s, v_s = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    sdpa = sdpa_call("default", q_s, k_s, v_s, causal=problem.causal)

    # Search: configs x split counts (a launch parameter: one build per config), short rounds.
    best, search, candidates = search_configs(
        problem,
        lambda kernel, splits: partial(_first, kernel.with_kvcache, q, k, v, num_splits=splits),
    )
    ours = candidates[best]
    config_json = best
    best_splits = json.loads(best)["num_splits"]

    # Correctness of the winner against SDPA (fp32 SDPA would not fit the largest caches).
    got = ours().float()
    want = sdpa().transpose(1, 2).float()
    rel = float(torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want))

    calls = {"ours": ours, "sdpa": sdpa}
    winner = Config.from_json(best)
    kernel = decode_kernel(
        winner, head_dim=d, dtype=problem.dtype, causal=problem.causal, device=0
    )
    clustered = (
        int(kernel.plan(problem, [(0, 0, 0)] * 4, 1.0, num_splits=int(best_splits)).cluster)
        if best_splits > 1
        else 0
    )
    if clustered:  # the same winner with its splits reduced by the combine entry instead
        calls["combine_entry"] = partial(
            _first,
            kernel.with_kvcache,
            q,
            k,
            v,
            num_splits=int(best_splits),
            cluster_combine=False,
        )
    final = alternating(calls)
    roofline = roofline_us(problem, copy_bw)
    top = fastest(search)
    rows = [
        row(
            problem,
            "contiguous",
            final["ours"],
            final["sdpa"],
            copy_bw,
            roofline,
            config_json,
            int(best_splits),
            rel,
            search[best].median_us,
            search_top=top,
            candidates=len(search),
            cluster=clustered,
            **({"combine_entry_us": round(final["combine_entry"], 2)} if clustered else {}),
        )
    ]
    if with_pages:
        # The contiguous winner (both families read pages of 16 rows and more).
        best_splits = json.loads(best)["num_splits"]
        kernel = decode_kernel(
            Config.from_json(best),
            head_dim=d,
            dtype=problem.dtype,
            causal=problem.causal,
            device=0,
        )
        for page_size in PAGE_SIZES:
            (k_p, v_p), table = paged((k, v), page_size, page_size)

            def paged_call(
                kern: Any,
                splits: int,
                k_p: torch.Tensor = k_p,
                v_p: torch.Tensor = v_p,
                table: torch.Tensor = table,
            ) -> Any:
                return partial(
                    _first, kern.with_kvcache, q, k_p, v_p, block_table=table, num_splits=splits
                )

            # The paged cache's own best config (a paged problem is tuned apart), and the
            # contiguous winner's config on it (what the loader's paging costs that tile).
            paged_best, paged_search, paged_calls = search_configs(
                problem, paged_call, f"paged{page_size}"
            )
            own = paged_calls[paged_best]
            same_config = paged_call(kernel, int(best_splits))
            diff = float((own().float() - got).abs().max())
            t = alternating(
                {"paged": own, "ours": ours, "sdpa": sdpa, "paged_contiguous_config": same_config}
            )
            rows.append(
                row(
                    problem,
                    f"paged{page_size}",
                    t["paged"],
                    t["sdpa"],
                    copy_bw,
                    roofline,
                    paged_best,
                    json.loads(paged_best)["num_splits"],
                    rel,
                    paged_search[paged_best].median_us,
                    contiguous_us=t["ours"],
                    paged_vs_contiguous=round(t["ours"] / t["paged"], 3),
                    paged_contiguous_config_us=t["paged_contiguous_config"],
                    paged_max_diff=diff,
                    search_top=fastest(paged_search),
                )
            )
            del k_p, v_p, paged_calls, own, same_config
        rows.append(seqlens_row(problem, (q, k, v), (q_s, k_s, v_s), copy_bw))
    return rows


def search_configs(
    problem: Problem, make_call: Callable[[Any, int], Callable[[], Any]], kv_cache: str = "dense"
) -> tuple[str, dict[str, Any], dict[str, Callable[[], Any]]]:
    """The fastest of the candidate configs x split counts on `problem` (`make_call(kernel,
    splits)` gives a call), by short flushed-alternating rounds: the winner's config JSON, every
    candidate's measurement and the calls."""
    lq, lk, b, hq, hkv, d = (
        problem.seqlen_q,
        problem.seqlen_k,
        problem.batch,
        problem.heads_q,
        problem.heads_kv,
        problem.head_dim,
    )
    candidates: dict[str, Callable[[], Any]] = {}
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    for config in configs_for(problem, kv_cache):
        tiles = math.ceil(lk / int(config["block_n"]))
        packs = config.family == "decode90" or bool(config["pack_gqa"])
        packed_rows = lq * (problem.group_size if packs else 1)
        ctas = math.ceil(packed_rows / int(config["block_m"])) * b * (hkv if packs else hq)
        kernel = decode_kernel(
            config, head_dim=d, dtype=problem.dtype, causal=problem.causal, device=0
        )
        for splits in SPLITS:
            # more splits than key tiles, or beyond four waves of CTAs, only add combine work
            if splits > 1 and (splits > tiles or ctas * splits > 4 * sm_count):
                break
            candidates[config.replace(num_splits=splits).to_json()] = make_call(kernel, splits)
    search = measure(
        {n: partial(_ignore_set, f) for n, f in candidates.items()},
        rounds=2,
        round_ms=4.0,
        warmup_ms=20.0,
        min_calls=15,
        max_calls=60,
    )
    best = min(search, key=lambda n: search[n].median_us)
    return best, search, candidates


def seqlens_row(
    problem: Problem,
    blhd: tuple[torch.Tensor, ...],
    bhld: tuple[torch.Tensor, ...],
    copy_bw: float,
) -> dict[str, Any]:
    """The padded cache with per-sequence lengths (the "seqlens" kind's lengths, spread over
    [Lk/2, Lk]), with its own best config, against SDPA on the same cache with the lengths as
    a mask; bandwidth counts the rows the sequences hold."""
    kind = replace(problem, kv_cache="seqlens")
    lengths = torch.tensor(kind.cache_lengths, dtype=torch.int32, device="cuda")
    sdpa = sdpa_call("default", *bhld, causal=problem.causal, mask=length_mask(kind, lengths))
    q, k, v = blhd
    best, search, calls = search_configs(
        problem,
        lambda kernel, splits: partial(
            _first, kernel.with_kvcache, q, k, v, cache_seqlens=lengths, num_splits=splits
        ),
        "seqlens",
    )
    call = calls[best]
    got, want = call().float(), sdpa().transpose(1, 2).float()
    rel = float(torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want))
    t = alternating({"seqlens": call, "sdpa": sdpa})
    roofline = roofline_us(kind, copy_bw)
    return row(
        kind,
        "seqlens",
        t["seqlens"],
        t["sdpa"],
        copy_bw,
        roofline,
        best,
        json.loads(best)["num_splits"],
        rel,
        search[best].median_us,
    )


def fastest(search: dict[str, Any], count: int = 5) -> list[dict[str, Any]]:
    """The `count` fastest candidates of a search, with their medians."""
    ranked = sorted(search, key=lambda n: search[n].median_us)
    return [
        {"config": json.loads(n), "median_us": round(search[n].median_us, 2)}
        for n in ranked[:count]
    ]


def _ignore_set(call: Callable[[], Any], _input_set: int) -> Any:
    return call()


def _first(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return call(*args, **kwargs)[0]


def alternating(
    calls: dict[str, Any], n: int = 41, flush: Callable[[], Any] | None = None
) -> dict[str, float]:
    """The plain alternating-call check: fixed order, L2 flushed before each call (by `flush`,
    else by writing a 512 MiB buffer), medians."""
    if flush is None:
        flush = torch.empty(512 << 20, dtype=torch.uint8, device="cuda").zero_
    for f in calls.values():
        f()
    times: dict[str, list[float]] = {name: [] for name in calls}
    pending = []
    for _ in range(n):
        for name, f in calls.items():
            flush()
            torch.cuda._sleep(50_000)  # the host enqueues the call before its start event fires
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            f()
            end.record()
            pending.append((name, start, end))
    torch.cuda.synchronize()
    for name, start, end in pending:
        times[name].append(start.elapsed_time(end) * 1e3)
    return {name: statistics.median(v) for name, v in times.items()}


def row(
    problem: Problem,
    kind: str,
    ours_us: float,
    sdpa_us: float,
    copy_bw: float,
    roofline_us: float,
    config: str,
    splits: int,
    rel: float,
    search_us: float | None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "problem": problem.as_dict(),
        "shape": problem.describe(),
        "cache": kind,
        "ours_us": round(ours_us, 2),
        "sdpa_us": round(sdpa_us, 2),
        "ours_tb_s": round(problem.bytes / ours_us / 1e6, 3),
        "sdpa_tb_s": round(problem.bytes / sdpa_us / 1e6, 3),
        "copy_tb_s": round(copy_bw, 3),
        "speedup": round(sdpa_us / ours_us, 3),
        "roofline_fraction": round(roofline_us / ours_us, 3),
        "family": json.loads(config)["family"],
        "config": json.loads(config),
        "num_splits": splits,
        "rel_err_vs_sdpa": rel,
        "search_us": search_us,
        **extra,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--shapes", default="llm-decode")
    parser.add_argument("--extra", action="store_true", help="also the EXTRA problems")
    parser.add_argument("--paged", action="store_true", help="paged caches on the PAGED problems")
    parser.add_argument("--limit", type=int, help="first N problems only")
    parser.add_argument(
        "--wide",
        action="store_true",
        help="search every 16-row config (block_n <= 128) at D=128 bf16",
    )
    parser.add_argument(
        "--families",
        default=",".join(FAMILIES),
        help="the families searched, comma-separated (default: both)",
    )
    parser.add_argument(
        "--min-lq", type=int, default=1, help="only problems with at least this many query tokens"
    )
    args = parser.parse_args()
    global WIDE
    WIDE = args.wide
    FAMILIES[:] = args.families.split(",")
    problems = load_shape_set(args.shapes)
    problems = [
        p
        for p in (problems[: args.limit] if args.limit else problems)
        if p.seqlen_q >= args.min_lq
    ]
    extra = [p for p in EXTRA if p.seqlen_q >= args.min_lq] if args.extra else []
    todo = (
        [(p, False) for p in problems]
        + ([(p, True) for p in PAGED] if args.paged else [])
        + [(p, False) for p in extra]
    )
    prebuild(todo)
    copy_bw = copy_tb_per_s()  # also what brings the GPU to its clock before the first search
    print(f"device copy: {copy_bw:.2f} TB/s (read + write)", flush=True)
    rows: list[dict[str, Any]] = []
    t0 = time.time()
    for problem, with_pages in todo:
        for r in run_problem(problem, copy_bw, with_pages):
            if with_pages and r["cache"] == "contiguous":
                continue  # already in the table from the shape set
            rows.append(r)
            print(
                f"{r['shape']:<40} {r['cache']:<10} ours {r['ours_tb_s']:6.2f} TB/s  "
                f"SDPA {r['sdpa_tb_s']:6.2f}  x{r['speedup']:5.2f}  roof "
                f"{r['roofline_fraction']:.2f}  {r['family']:<8} splits {r['num_splits']:3d}"
                f"{'c' if r.get('cluster') else ' '} "
                f"rel {r['rel_err_vs_sdpa']:.1e}  [{time.time() - t0:.0f} s]",
                flush=True,
            )
        torch.cuda.empty_cache()
        summary = write(args.json, rows, copy_bw)  # after every problem: a timeout keeps them
    print(
        f"geomean x{summary['geomean_speedup']:.3f} over {summary['problems']} problems, "
        f"worst x{summary['worst_speedup']:.3f}"
    )
    return 0


def prebuild(todo: list[tuple[Problem, bool]]) -> None:
    """Every candidate config of every problem built before anything is timed, on all cores.
    Built one at a time inside the searches (H200, 2026-12-02), the first search came after
    140 s of compiling with the GPU idle and timed every candidate of B1 H32/8 Lq1 Lk8k about
    1.6x slow."""
    from autotune.build import compile_many

    configs: dict[str, Config] = {}
    for problem, with_pages in todo:
        kinds = ["dense"] + (["seqlens"] + [f"paged{n}" for n in PAGE_SIZES] if with_pages else [])
        for kind in kinds:
            for config in configs_for(problem, kind):
                configs.setdefault(config.digest, config)
    t0 = time.time()
    built = compile_many(list(configs.values()), _target())
    failed = [b.name for b in built if not b.ok]
    print(
        f"prebuilt {len(built)} candidate configs in {time.time() - t0:.0f} s"
        f"{f', failed: {failed}' if failed else ''}",
        flush=True,
    )


def write_probe(path: str, rows: list[dict[str, Any]], **extra: Any) -> None:
    """A probe's rows as JSON, with the command that made them and the device."""
    with open(path, "w") as f:
        json.dump(
            {
                "command": " ".join(sys.argv),
                "device": torch.cuda.get_device_name(),
                **extra,
                "rows": rows,
            },
            f,
            indent=1,
        )


def write(path: str, rows: list[dict[str, Any]], copy_bw: float) -> dict[str, Any]:
    contiguous = [r for r in rows if r["cache"] == "contiguous"]
    geo = math.exp(statistics.fmean(math.log(r["speedup"]) for r in contiguous))
    summary = {
        "copy_tb_s": copy_bw,
        "geomean_speedup": geo,
        "worst_speedup": min(r["speedup"] for r in contiguous),
        "problems": len(contiguous),
        "command": " ".join(sys.argv),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
    }
    with open(path, "w") as f:
        json.dump({"summary": summary, "rows": rows}, f, indent=1)
    return summary


if __name__ == "__main__":
    sys.exit(main())
