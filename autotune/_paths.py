"""Where the project's data lives: kernel sources, search spaces, the cache directory."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _data_dir(name: str) -> Path:
    # Installed wheel: the directory ships inside the package. Source checkout or editable
    # install: it sits beside the package at the repository root.
    for candidate in (_PACKAGE / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"cannot find the {name}/ directory next to {_PACKAGE}")


def kernel_src_dir() -> Path:
    return _data_dir("kernel_src")


def search_spaces_dir() -> Path:
    return _data_dir("search_spaces")


def db_dir() -> Path:
    return _data_dir("db")


MODEL_SUFFIX = ".model.json"


def shipped_results_files() -> list[Path]:
    """The pre-tuned results shipped in db/ (`<gpu>.json`, exports), in name order."""
    return sorted(p for p in db_dir().glob("*.json") if not p.name.endswith(MODEL_SUFFIX))


def shipped_model_files() -> list[Path]:
    """The performance models shipped in db/ (`<gpu>.model.json`), in name order."""
    return sorted(db_dir().glob(f"*{MODEL_SUFFIX}"))


def cache_dir() -> Path:
    """$CUTE_AUTOTUNE_CACHE, else $XDG_CACHE_HOME/cute-autotune, else ~/.cache/cute-autotune."""
    override = os.environ.get("CUTE_AUTOTUNE_CACHE")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "cute-autotune"
