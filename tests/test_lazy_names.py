"""A lazily resolved public name is kept on its package after the first lookup: calling
`autotune.attention` in every layer of a model must cost an attribute read, not an import."""

from __future__ import annotations

import autotune
import autotune.model


def test_a_resolved_name_is_kept_on_the_package() -> None:
    first = autotune.attention
    assert autotune.__dict__["attention"] is first and autotune.attention is first
    assert autotune.model.Problem is autotune.model.__dict__["Problem"]
