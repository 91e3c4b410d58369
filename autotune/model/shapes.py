"""Shape sets: named lists of problems to tune, declared in search_spaces/shapes/<name>.toml."""

from __future__ import annotations

import itertools
from pathlib import Path

from .._paths import search_spaces_dir
from .problem import Problem
from .space import read_toml


def shape_sets() -> list[str]:
    return sorted(p.stem for p in (search_spaces_dir() / "shapes").glob("*.toml"))


def load_shape_set(name_or_path: str) -> list[Problem]:
    """Problems of a shape set, by name ("llm-prefill") or path to a TOML file."""
    path = Path(name_or_path)
    if not path.is_file():
        path = search_spaces_dir() / "shapes" / f"{name_or_path.removesuffix('.toml')}.toml"
    if not path.is_file():
        raise ValueError(f"unknown shape set {name_or_path!r}; known: {', '.join(shape_sets())}")
    data = read_toml(path)
    try:
        problems: list[Problem] = []
        for shape in data["shapes"]:
            # A shape may pin dtype, head_dim or causal (else the file's lists apply), say
            # how its KV cache is held (kv_cache, "dense" unless given) and which pass is
            # timed (backward, deterministic: the forward unless given), and any of its values
            # may be a list: the shape stands for every combination.
            axes = {
                "dtype": data.get("dtypes"),
                "head_dim": data.get("head_dims"),
                "causal": data.get("causal"),
                "kv_cache": "dense",
                "backward": False,
                "deterministic": False,
            }
            axes.update({k: v for k, v in shape.items()})
            names = list(axes)
            for combo in itertools.product(
                *(v if isinstance(v, list) else [v] for v in axes.values())
            ):
                one = dict(zip(names, combo, strict=True))
                seqlen_q = int(one["seqlen_q"] if "seqlen_q" in one else one["seqlen"])
                seqlen_k = int(one["seqlen_k"] if "seqlen_k" in one else one["seqlen"])
                problem = Problem(
                    one["batch"],
                    one["heads_q"],
                    one.get("heads_kv", one["heads_q"]),
                    seqlen_q,
                    seqlen_k,
                    one["head_dim"],
                    one["dtype"],
                    one["causal"],
                    one["kv_cache"],
                    one["backward"],
                    one["deterministic"],
                )
                if (
                    _kv_bytes(problem) <= data.get("max_kv_gib", 1e9) * 2**30
                    and problem not in problems
                ):
                    problems.append(problem)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: malformed shape set ({exc!r})") from None
    return problems


def _kv_bytes(problem: Problem) -> int:
    return 2 * 2 * problem.batch * problem.heads_kv * problem.seqlen_k * problem.head_dim
