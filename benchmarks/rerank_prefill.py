"""Re-rank each llm-prefill problem's finalists beside torch SDPA's backends on the GPU, in the
one timing regime, and store the winners (torch SDPA where it wins) in a database seeded with
the shipped results: no new search (benchmarks/prefill_finalists.py says where the finalists
come from).

    python benchmarks/rerank_prefill.py --db sqlite:///h200.db [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from autotune.model import Config, Problem, load_space
from autotune.store import TuningStore
from autotune.tune import (
    SDPA_FAMILY,
    GpuBackend,
    SearchSettings,
    rerank_finalists,
    sdpa_configs,
    study_name,
)

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", required=True)
    parser.add_argument("--finalists",
                        default=str(ROOT / "benchmarks/configs/prefill_finalists.json"))
    parser.add_argument("--json")
    parser.add_argument("--limit", type=int)
    args = parser.parse_args()
    store = TuningStore(args.db)
    print("seeded from db/h200.json:",
          store.import_results(json.loads((ROOT / "db/h200.json").read_text())))
    backend = GpuBackend(0)
    device = backend.device()
    settings = SearchSettings()
    rows = []
    plan = json.loads(Path(args.finalists).read_text())["problems"][: args.limit]
    for entry in plan:
        start = time.monotonic()
        problem = Problem(**entry["problem"])
        configs = [Config.from_dict(c) for c in entry["configs"]] + sdpa_configs(problem)
        finalists = [(study_name(device, c.family, problem), c) for c in configs]
        final = rerank_finalists(problem, backend, store, settings, finalists, device,
                                 study_name(device, SDPA_FAMILY, problem), None,
                                 trials=0)
        assert final.winner is not None, problem.describe()
        win = final.winner.result
        default = final.baselines["default"].median_us
        assert win.median_us is not None
        row = {"shape": problem.describe(), "problem": problem.as_dict(),
               "winner": win.config.as_dict(), "family": win.config.family,
               "median_us": win.median_us, "p20_us": win.p20_us, "p80_us": win.p80_us,
               "sdpa_default_us": default, "speedup_vs_sdpa_default": default / win.median_us,
               "decision": final.decision,
               "finalists": [{"config": r.result.config.as_dict(),
                              "median_us": r.result.median_us, "p20_us": r.result.p20_us,
                              "p80_us": r.result.p80_us} for r in final.reranked],
               "env": win.env.as_dict() if win.env else None,
               "seconds": round(time.monotonic() - start, 1)}
        rows.append(row)
        print(f"{row['shape']:<34} {load_space(win.config.family).name_of(win.config):<70} "
              f"{row['speedup_vs_sdpa_default']:.3f}x  {final.decision}", flush=True)
    backend.close()
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
