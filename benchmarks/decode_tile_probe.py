"""Where a decode tile's time goes: chosen tiles and split counts against a read of the same keys,
at several cache lengths, in one plain alternating check.

For each case (a problem B,Hq,Hkv,Lq at D=128 bf16 in the bench's [B, L, H, D] layout, its cache
lengths and its tiles) and each cache length, this times (fixed order, L2 flushed by writing 512
MiB before each call, median of 41):
a one-element fill (the timing's floor), a read of K and V (a sum over them: the bytes any kernel
must read), SDPA's default, and every tile x split count of the config file through the decode
kernel itself (not `attention()`: no lookup). Each kernel's output is checked against SDPA's.
The columns: the time, its fraction of the decode bench's roofline (a 4 GiB copy's bandwidth
measured in the same run), and its excess over the read of the same keys. At a short cache the
time is the fixed cost of a call (launch, prologue, epilogue, combine); the slope between two long
caches is the rate a tile streams at.

    python benchmarks/decode_tile_probe.py --case 8,64,8,16 256,8192,32768 tiles.json \
        [--case ...] --causal --json OUT.json

tiles.json is a list of decode or decode90 configs without problem values, each with a "splits"
list, and optionally "cluster_combine": false (the splits reduced by the combine entry, not in a
thread-block cluster). Run from an older tree's root (its kernels, this script copied in), the
same command times that tree's kernels: two runs in turn compare kernel versions.
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from typing import Any

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from alternating_check import _sdpa  # noqa: E402
from decode_bench import (  # noqa: E402
    _first,
    alternating,
    copy_tb_per_s,
    roofline_us,
    write_probe,
)

from autotune.model import Config, Problem  # noqa: E402
from autotune.runtime import decode_kernel  # noqa: E402


def tile_label(tile: dict[str, Any]) -> str:
    short = {"block_m": "bm", "block_n": "bn", "consumer_wgs": "wg", "kv_stages": "s",
             "overlap": "o", "ctas_per_sm": "c", "pingpong": "pp"}
    return " ".join(f"{short.get(k, k)}{int(v) if isinstance(v, bool) else v}"
                    for k, v in tile.items() if k != "family")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", nargs=3, action="append", required=True,
                        metavar=("B,Hq,Hkv,Lq", "LK,LK,...", "TILES_JSON"))
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    copy_bw = copy_tb_per_s()
    fill = torch.zeros(1, device="cuda")
    calls: dict[str, Any] = {"fill": fill.zero_}
    meta: dict[str, dict[str, Any]] = {}
    errors: dict[str, float] = {}
    for shape, lengths, tiles_file in args.case:
        b, hq, hkv, lq = (int(x) for x in shape.split(","))
        tag = f"B{b} H{hq}/{hkv} Lq{lq}"
        with open(tiles_file) as f:
            tiles = json.load(f)
        for lk in (int(x) for x in lengths.split(",")):
            problem = Problem(b, hq, hkv, lq, lk, 128, "bf16", args.causal)
            q = torch.randn(b, lq, hq, 128, device="cuda", dtype=torch.bfloat16)
            kv = torch.randn(2, b, lk, hkv, 128, device="cuda", dtype=torch.bfloat16)
            k, v = kv[0], kv[1]
            q_s, k_s, v_s = (t.transpose(1, 2).contiguous() for t in (q, k, v))
            sdpa = _sdpa(q_s, k_s, v_s, args.causal, None)
            reference = sdpa().transpose(1, 2).float()
            base = {"case": tag, "lk": lk, "roofline_us": roofline_us(problem, copy_bw),
                    "bytes": problem.bytes}
            calls[f"{tag} read Lk{lk}"] = partial(kv.sum, dtype=torch.float32)
            meta[f"{tag} read Lk{lk}"] = {**base, "kind": "read"}
            calls[f"{tag} sdpa Lk{lk}"] = sdpa
            meta[f"{tag} sdpa Lk{lk}"] = {**base, "kind": "sdpa"}
            for tile in tiles:
                tile = dict(tile)
                splits = tile.pop("splits")
                # "cluster_combine": false reduces the splits with the combine entry instead
                cluster = tile.pop("cluster_combine", True)
                family = tile["family"]
                values = {k: v for k, v in tile.items() if k != "family"}
                config = Config.make(family, {**problem.space_values(), **values, "num_splits": 1})
                kernel = decode_kernel(config, head_dim=128, dtype="bf16", causal=args.causal,
                                       device=0)
                for s in splits:
                    name = f"{tag} {tile_label(tile)} x{s}{'' if cluster else ' entry'} Lk{lk}"
                    call = partial(_first, kernel.with_kvcache, q, k, v, num_splits=s,
                                   cluster_combine=cluster)
                    out = call().float()
                    errors[name] = float((out - reference).abs().max() /
                                         reference.abs().max().clamp_min(1e-6))
                    if not torch.isfinite(out).all() or errors[name] > 2e-2:
                        raise SystemExit(f"{name}: wrong output (max rel err {errors[name]:.3g})")
                    calls[name] = call
                    meta[name] = {**base, "kind": "kernel", "tile": tile, "splits": s}
    times = alternating(calls)
    reads = {(m["case"], m["lk"]): times[n] for n, m in meta.items() if m["kind"] == "read"}
    rows = []
    for name, us in times.items():
        m = meta.get(name, {})
        row = {"call": name, "us": round(us, 2), **{k: v for k, v in m.items() if k != "bytes"}}
        if m:
            row["fraction"] = round(m["roofline_us"] / us, 3)
            row["over_read_us"] = round(us - reads[m["case"], m["lk"]], 2)
            row["tb_s"] = round(m["bytes"] / us / 1e6, 3)
        if name in errors:
            row["max_rel_err_vs_sdpa"] = round(errors[name], 5)
        rows.append(row)
    print(f"{'causal' if args.causal else 'full'}; copy {copy_bw:.2f} TB/s; "
          f"fill {times['fill']:.2f} us")
    print(f"{'call':<66} {'us':>8} {'roofline':>8} {'over read':>9}")
    for r in rows[1:]:
        print(f"{r['call']:<66} {r['us']:8.2f} {r['fraction']:8.3f} {r['over_read_us']:9.2f}")
    write_probe(args.json, rows, copy_tb_s=round(copy_bw, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
