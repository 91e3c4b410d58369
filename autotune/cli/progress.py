"""The progress bar of the commands that compile or validate one config after another."""

from __future__ import annotations

import sys
from typing import Any


def progress(total: int, desc: str, enabled: bool) -> Any:
    """A tqdm bar on stderr counting configs (a silent one when not `enabled`)."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="cfg",
        file=sys.stderr,
        disable=not enabled,
        dynamic_ncols=True,
        mininterval=0.5,
    )
