"""Split the builds of a piece of a family's space into config lists for `cute-autotune check`
processes that run side by side on one GPU (validation is mostly host-bound; timing is not, so
benchmarks/sweep.py then only times, taking these validations with --verdicts).

One config per build: configs that differ only in a launch parameter (the decode family's split
count) share a cubin. Each build is checked at one launch value, taken in turn from --splits,
so the piece's checks cover every listed split count; the validator's KV-cache cases add more.

    python benchmarks/check_parts.py --family decode --head-dim 128 --dtype bf16 \\
        --parts 4 --out /tmp/part    # writes /tmp/part_0.json ... /tmp/part_3.json
"""

from __future__ import annotations

import argparse
import json
import sys

from autotune.model import Config, default_target, load_space


def one_per_build(family: str, head_dim: int, dtypes: list[str], causal: list[bool],
                  splits: list[int]) -> list[Config]:
    space, target = load_space(family), default_target()
    builds: dict[Config, list[Config]] = {}
    for dtype in dtypes:
        for mask in causal:
            values: dict[str, int | bool | str] = {"head_dim": head_dim, "dtype": dtype,
                                                   "causal": mask}
            for config in space.valid_configs(target, values):
                builds.setdefault(space.build_view(config), []).append(config)
    chosen = []
    for i, (build, configs) in enumerate(builds.items()):
        want = splits[i % len(splits)] if "num_splits" in build.as_dict() else None
        chosen.append(next((c for c in configs if c.as_dict().get("num_splits") == want), build))
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", required=True)
    parser.add_argument("--head-dim", type=int, required=True)
    parser.add_argument("--dtype", nargs="+", default=["fp16", "bf16"])
    parser.add_argument("--causal", choices=["false", "true", "both"], default="both")
    parser.add_argument("--splits", type=int, nargs="+", default=[1, 8, 16, 32],
                        help="split counts to check the builds at, in turn")
    parser.add_argument("--parts", type=int, default=4)
    parser.add_argument("--out", required=True, help="prefix of the part files")
    args = parser.parse_args()
    causal = {"false": [False], "true": [True], "both": [False, True]}[args.causal]
    configs = one_per_build(args.family, args.head_dim, args.dtype, causal, args.splits)
    for part in range(args.parts):
        with open(f"{args.out}_{part}.json", "w") as f:
            json.dump([c.as_dict() for c in configs[part::args.parts]], f)
    print(f"{len(configs)} builds of {args.family} D={args.head_dim} in {args.parts} parts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
