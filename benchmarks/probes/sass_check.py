"""What the dispatched kernels are made of, from their SASS: the tensor-core instructions
(HGMMA on Hopper's wgmma path, HMMA on mma.sync), local-memory traffic (LDL/STL: spills or a
stack frame), TMA copies (UTMALDG/UTMASTG), register reallocation (USETMAXREG), and the wgmma
waits (WARPGROUP.DEPBAR): as many waits as HGMMAs means ptxas serialised them.

    python benchmarks/probes/sass_check.py --bench benchmarks/results/sm90_bench_h200.json \
        --cache sm90=.cubins90 --cache sm80=.cubins --json out.json
    python benchmarks/probes/sass_check.py --db sqlite:///.tuning/h200.db \
        --cache sm90=.cubins90 ...

Each config of the bench rows is looked up in the kernel cache of its family (no compile);
needs cuobjdump (the CUDA toolkit's, or $CUOBJDUMP).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from autotune.build import ArtifactCache, lookup
from autotune.model import Config, load_space, target_for_arch

WATCHED = {
    "HGMMA": "wgmma",
    "HMMA": "mma.sync",
    "LDL": "local load",
    "STL": "local store",
    "UTMALDG": "TMA load",
    "UTMASTG": "TMA store",
    "USETMAXREG": "setmaxnreg",
}
OPCODE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*)", re.M)


def cuobjdump() -> str:
    found = (
        os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    )
    if not Path(found).exists():
        sys.exit("cuobjdump not found (set $CUOBJDUMP)")
    return found


WGMMA_WAIT = re.compile(r"\bWARPGROUP\.DEPBAR\b")


def opcode_counts(cubin: Path, tool: str) -> Counter[str]:
    sass = subprocess.run(
        [tool, "-sass", str(cubin)], check=True, capture_output=True, text=True
    ).stdout
    counts = Counter(m.group(1) for m in OPCODE.finditer(sass))
    counts["WGWAIT"] = len(WGMMA_WAIT.findall(sass))
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", type=Path, help="a `cute-autotune bench` JSON")
    ap.add_argument("--db", help="or a tuning database (its best configs)")
    ap.add_argument(
        "--cache",
        action="append",
        default=[],
        metavar="FAMILY=DIR",
        help="the kernel cache holding a family's cubins (repeatable)",
    )
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    caches = {k: ArtifactCache(Path(v)) for k, v in (c.split("=", 1) for c in args.cache)}
    target, tool = target_for_arch(args.arch), cuobjdump()
    rows: list[dict[str, Any]] = []
    seen: dict[str, dict[str, Any]] = {}
    if bool(args.bench) == bool(args.db):
        ap.error("give one of --bench and --db")
    if args.bench:
        source = json.loads(args.bench.read_text())["rows"]
    else:
        from autotune.store import TuningStore

        source = [
            {"shape": r.problem.describe(), "config": r.config.as_dict()}
            for r in TuningStore(args.db).list_best()
        ]
    for bench_row in source:
        if not bench_row.get("config"):
            continue
        config = Config.from_json(json.dumps(bench_row["config"]))
        if config.digest not in seen:
            build = lookup(config, target, caches.get(config.family))
            entry: dict[str, Any] = {"config": load_space(config.family).name_of(config)}
            if build is None or build.cubin is None:
                entry["missing"] = "not in the kernel cache"
            else:
                counts = opcode_counts(build.cubin, tool)
                entry.update({k: counts.get(k, 0) for k in WATCHED})
                entry["WGWAIT"] = counts["WGWAIT"]
                entry["serialized"] = bool(counts["HGMMA"]) and counts["WGWAIT"] >= counts["HGMMA"]
                report = build.ptxas  # None for a cache entry without the ptxas report
                entry.update(
                    registers=report.registers if report else None,
                    spill_bytes=report.spill_store_bytes + report.spill_load_bytes
                    if report
                    else None,
                    stack_frame_bytes=report.stack_frame_bytes if report else None,
                )
            seen[config.digest] = entry
        rows.append({"shape": bench_row["shape"], **seen[config.digest]})
    header = ["shape", "config", *WATCHED, "WGWAIT", "serialized", "registers", "spill_bytes"]
    print("  ".join(header))
    for r in rows:
        print("  ".join(str(r.get(h, r.get("missing", ""))) for h in header))
    local = [r for r in rows if r.get("LDL") or r.get("STL")]
    print(
        f"\n{len(rows)} shapes, {len(seen)} kernels; local memory in "
        f"{len(local)} shapes; wgmma in {sum(bool(r.get('HGMMA')) for r in rows)}, "
        f"serialised in {sum(bool(r.get('serialized')) for r in rows)}"
    )
    if args.json:
        args.json.write_text(
            json.dumps({"source": str(args.bench or args.db), "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
