"""The finalists of each llm-prefill problem for a re-ranking beside torch SDPA, from results
already measured on the H200 (no new search): per problem, the shipped sm90 best
(db/h200.json) and the shipped sm90 bests of the nearest other problems of its class (dtype,
head dim, causality) up to five distinct configs, and the sm80 best of the problem
(benchmarks/results/tune_llm_prefill_h200.json). The per-config search histories these came
from live in tuning databases that are not in the repository; this is the closest stored top
five per family.

    python benchmarks/prefill_finalists.py benchmarks/configs/prefill_finalists.json
    cute-autotune compile --config @<configs file> --arch sm_90   # every distinct config
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from autotune.model import Problem
from autotune.store import problem_distance

ROOT = Path(__file__).resolve().parent.parent
TOP = 5


def finalists() -> list[dict[str, Any]]:
    shipped = json.loads((ROOT / "db/h200.json").read_text())["results"]
    sm80 = json.loads((ROOT / "benchmarks/results/tune_llm_prefill_h200.json").read_text())
    sm80_best = {Problem(**{k: r[k] for k in Problem.__dataclass_fields__}): r["config"]
                 for r in sm80["rows"] if r.get("family") == "sm80"}
    best = [(Problem(**r["problem"]), r["config"]) for r in shipped]
    out = []
    for problem, config in best:
        same_class = sorted(
            ((problem_distance(problem, other), json.dumps(c, sort_keys=True))
             for other, c in best
             if (other.dtype, other.head_dim, other.causal)
             == (problem.dtype, problem.head_dim, problem.causal) and other != problem))
        chosen = [json.dumps(config, sort_keys=True)]
        for _, text in same_class:
            if len(chosen) >= TOP:
                break
            if text not in chosen:
                chosen.append(text)
        configs = [json.loads(t) for t in chosen]
        if problem in sm80_best:
            configs.append(sm80_best[problem])
        out.append({"problem": problem.as_dict(), "configs": configs})
    return out


def main() -> int:
    data = finalists()
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    distinct = {json.dumps(c, sort_keys=True) for row in data for c in row["configs"]}
    text = json.dumps({"problems": data}, indent=1)
    if target:
        target.write_text(text + "\n")
        configs_file = target.with_name(target.stem + "_configs.json")
        configs_file.write_text(json.dumps([json.loads(t) for t in sorted(distinct)]) + "\n")
        print(f"{len(data)} problems, {len(distinct)} distinct configs -> {target}, "
              f"{configs_file}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
