"""Merge the JSON outcomes of `cute-autotune tune --json` pieces into the evidence file for a
shape set, and print the per-shape table (tuned TFLOP/s beside SDPA default and FLASH measured
in the same session, speed-ups, trials, and the winning config's ptxas facts).

    CUTE_AUTOTUNE_CACHE=.cubins python benchmarks/tune_table.py OUT.json PIECE.json [...]

The ptxas facts (registers, spills) and resident CTAs per SM of each winner come from the
artifact cache the session compiled into ($CUTE_AUTOTUNE_CACHE); "-" where it is not there.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from autotune.build.compiler import lookup
from autotune.cli.table import render_table
from autotune.model.config import Config
from autotune.model.occupancy import ctas_per_sm
from autotune.model.space import load_space
from autotune.model.target import target_for_arch

KEYS = ("dtype", "head_dim", "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "causal")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("pieces", nargs="+")
    args = parser.parse_args()
    rows: dict[tuple[object, ...], dict[str, Any]] = {}
    for piece in args.pieces:
        for row in json.loads(Path(piece).read_text()):
            rows[tuple(row[k] for k in KEYS)] = row  # a later piece supersedes an earlier one
    ordered = sorted(rows.values(), key=lambda r: tuple(str(r[k]) for k in KEYS))
    for row in ordered:
        row["build"] = _build_facts(row)
    speedups = [r["speedup_vs_default"] for r in ordered if r.get("speedup_vs_default")]
    flash = [r["speedup_vs_flash"] for r in ordered if r.get("speedup_vs_flash")]
    geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None  # noqa: E731
    payload = {"rows": ordered, "geomean_vs_sdpa_default": geo(speedups),
               "geomean_vs_sdpa_flash": geo(flash), "pieces": args.pieces}
    Path(args.output).write_text(json.dumps(payload, indent=1))
    table = []
    for r in ordered:
        config = Config.from_dict(r["config"]) if r.get("config") else None
        name = load_space(config.family).name_of(config) if config else "-"
        table.append([f"{r['dtype']} D{r['head_dim']} {'causal' if r['causal'] else 'full'}",
                      f"{r['batch']},{r['heads_q']}/{r['heads_kv']},{r['seqlen_q']}",
                      name.removeprefix("fwd_"), f"{r['tflops']:.1f}" if r["tflops"] else "-",
                      f"{r['sdpa_default_tflops']:.1f}", f"{r['sdpa_flash_tflops']:.1f}"
                      if r.get("sdpa_flash_tflops") else "-",
                      f"{r['speedup_vs_default']:.2f}x" if r.get("speedup_vs_default") else "-",
                      f"{r['speedup_vs_flash']:.2f}x" if r.get("speedup_vs_flash") else "-",
                      r["trials"], *_facts_cells(r["build"])])
    print(render_table(["problem", "B,Hq/Hkv,L", "best config", "TFLOP/s", "SDPA default",
                        "SDPA FLASH", "vs default", "vs FLASH", "trials", "regs",
                        "spill st/ld", "smem KB", "CTAs/SM"], table))
    print(f"\n{len(ordered)} shapes; geomean vs SDPA default "
          f"{payload['geomean_vs_sdpa_default']}, vs FLASH {payload['geomean_vs_sdpa_flash']}")
    return 0


def _build_facts(row: dict[str, object]) -> dict[str, object] | None:
    if not row.get("config"):
        return None
    cc = int(row["device"]["compute_capability"])  # type: ignore[index]
    build = lookup(Config.from_dict(row["config"]), target_for_arch(cc))
    if build is None or build.ptxas is None or build.launch_info is None:
        return None
    info = build.launch_info
    return {"ptxas": build.ptxas.as_dict(), "smem_bytes": info.smem_bytes,
            "threads": info.threads,
            "occupancy": ctas_per_sm(cc, build.ptxas.registers, info.threads, info.smem_bytes)}


def _facts_cells(facts: dict[str, object] | None) -> list[str]:
    if not facts:
        return ["-"] * 4
    ptxas, occupancy = facts["ptxas"], facts["occupancy"]
    return [str(ptxas["registers"]),  # type: ignore[index]
            f"{ptxas['spill_store_bytes']}/{ptxas['spill_load_bytes']}",  # type: ignore[index]
            str(int(facts["smem_bytes"]) // 1024),  # type: ignore[call-overload]
            str(occupancy["ctas"])]  # type: ignore[index]


if __name__ == "__main__":
    sys.exit(main())
