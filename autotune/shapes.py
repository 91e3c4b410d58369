"""Shape sets: named lists of problems to tune, declared in search_spaces/shapes/<name>.toml."""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path

from ._paths import search_spaces_dir
from .problem import Problem


def shape_sets() -> list[str]:
    return sorted(p.stem for p in (search_spaces_dir() / "shapes").glob("*.toml"))


def load_shape_set(name_or_path: str) -> list[Problem]:
    """Problems of a shape set, by name ("llm-prefill") or path to a TOML file."""
    path = Path(name_or_path)
    if not path.is_file():
        path = search_spaces_dir() / "shapes" / f"{name_or_path.removesuffix('.toml')}.toml"
    if not path.is_file():
        raise ValueError(f"unknown shape set {name_or_path!r}; known: {', '.join(shape_sets())}")
    with open(path, "rb") as f:
        data = tomllib.load(f)
    try:
        problems = []
        for dtype, head_dim, causal, shape in itertools.product(
                data["dtypes"], data["head_dims"], data["causal"], data["shapes"]):
            seqlen_q = shape.get("seqlen_q", shape.get("seqlen"))
            seqlen_k = shape.get("seqlen_k", shape.get("seqlen"))
            problems.append(Problem(shape["batch"], shape["heads_q"],
                                    shape.get("heads_kv", shape["heads_q"]), seqlen_q, seqlen_k,
                                    head_dim, dtype, causal))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: malformed shape set ({exc!r})") from None
    return problems
