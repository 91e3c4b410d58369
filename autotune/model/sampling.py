"""A seeded sample of a family's valid configs that covers every value of every parameter.

Validating the whole space of a family on a GPU costs hours of nvcc; between kernel versions a
sample has to show that nothing broke anywhere. A plain random sample can miss a rare value
(block_n 176 is valid in few combinations), so coverage comes first: for each value of each
parameter not yet in the sample, one config holding it is drawn; the rest of the quota is drawn
at random. Stratified by the problem classes (head dim, dtype, causal) so each gets its share."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Sequence

from .config import Config, Value


def covering_sample(configs: Sequence[Config], fraction: float, seed: int = 0) -> list[Config]:
    """At least ceil(fraction * len(configs)) of `configs` (in their order), holding every
    value every parameter takes among them; the same seed gives the same sample."""
    if not 0 < fraction <= 1:
        raise ValueError(f"a sample fraction must be in (0, 1], not {fraction}")
    rng = random.Random(seed)
    order = list(range(len(configs)))
    rng.shuffle(order)
    chosen: set[int] = set()
    by_value: dict[tuple[str, Value], list[int]] = defaultdict(list)
    for i in order:
        for name, value in configs[i].values:
            by_value[(name, value)].append(i)
    for key in sorted(by_value, key=str):
        if not any(i in chosen for i in by_value[key]):
            chosen.add(by_value[key][0])
    # Fill each problem class (the configs sharing problem values) to its own share.
    classes: dict[tuple[tuple[str, Value], ...], list[int]] = defaultdict(list)
    for i in order:
        classes[_problem_key(configs[i])].append(i)
    for members in classes.values():
        quota = math.ceil(fraction * len(members))
        have = sum(i in chosen for i in members)
        for i in members:
            if have >= quota:
                break
            if i not in chosen:
                chosen.add(i)
                have += 1
    return [configs[i] for i in sorted(chosen)]


def _problem_key(config: Config) -> tuple[tuple[str, Value], ...]:
    return tuple((k, v) for k, v in config.values if k in ("head_dim", "dtype", "causal"))
