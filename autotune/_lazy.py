"""Lazy public names for the package and its stages: a name is imported from its module on first
use, so importing one module of a stage does not load the rest (PEP 562 module __getattr__)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_getattr(package: str, table: Mapping[str, tuple[str, str]]) -> Callable[[str], object]:
    """A module-level `__getattr__` for `package`: name -> (submodule, attribute) in `table`."""

    def __getattr__(name: str) -> object:
        if name in table:
            module, attr = table[name]
            # Read from the loaded module each time, never kept on the package (a test or a
            # user may replace the name on its module); sys.modules spares a hot path such as
            # `autotune.attention` in every layer the import machinery's per-call cost.
            loaded = sys.modules.get(f"{package}.{module}")
            if loaded is None:
                loaded = importlib.import_module(f".{module}", package)
            return getattr(loaded, attr)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
