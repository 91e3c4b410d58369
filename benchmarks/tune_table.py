"""Merge the JSON outcomes of `cute-autotune tune --json` pieces into the evidence file for a
shape set, and print the per-shape table (tuned TFLOP/s beside SDPA default and FLASH measured
in the same session, speed-ups, trials, and the winning config's ptxas facts).

    python benchmarks/tune_table.py OUT.json PIECE.json [PIECE.json ...]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from autotune._table import render_table
from autotune.config import Config
from autotune.space import load_space

KEYS = ("dtype", "head_dim", "batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "causal")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("pieces", nargs="+")
    args = parser.parse_args()
    rows: dict[tuple[object, ...], dict[str, object]] = {}
    for piece in args.pieces:
        for row in json.loads(Path(piece).read_text()):
            rows[tuple(row[k] for k in KEYS)] = row  # a later piece supersedes an earlier one
    ordered = sorted(rows.values(), key=lambda r: tuple(str(r[k]) for k in KEYS))
    speedups = [r["speedup_vs_default"] for r in ordered if r.get("speedup_vs_default")]
    flash = [r["speedup_vs_flash"] for r in ordered if r.get("speedup_vs_flash")]
    geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None  # noqa: E731
    payload = {"rows": ordered, "geomean_vs_sdpa_default": geo(speedups),
               "geomean_vs_sdpa_flash": geo(flash), "pieces": args.pieces}
    Path(args.output).write_text(json.dumps(payload, indent=1))
    space = load_space("sm80")
    table = []
    for r in ordered:
        name = space.name_of(Config.from_dict(r["config"])) if r.get("config") else "-"
        table.append([f"{r['dtype']} D{r['head_dim']} {'causal' if r['causal'] else 'full'}",
                      f"{r['batch']},{r['heads_q']}/{r['heads_kv']},{r['seqlen_q']}",
                      name.removeprefix("fwd_sm80_"), f"{r['tflops']:.1f}" if r["tflops"] else "-",
                      f"{r['sdpa_default_tflops']:.1f}", f"{r['sdpa_flash_tflops']:.1f}"
                      if r.get("sdpa_flash_tflops") else "-",
                      f"{r['speedup_vs_default']:.2f}x" if r.get("speedup_vs_default") else "-",
                      f"{r['speedup_vs_flash']:.2f}x" if r.get("speedup_vs_flash") else "-",
                      r["trials"]])
    print(render_table(["problem", "B,Hq/Hkv,L", "best config", "TFLOP/s", "SDPA default",
                        "SDPA FLASH", "vs default", "vs FLASH", "trials"], table))
    print(f"\n{len(ordered)} shapes; geomean vs SDPA default "
          f"{payload['geomean_vs_sdpa_default']}, vs FLASH {payload['geomean_vs_sdpa_flash']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
