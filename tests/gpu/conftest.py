"""Fixtures of the GPU tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def kernels_on_untuned_problems(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """An empty database and the kernels' own defaults on untuned problems, for a module:
    the path under test is then the kernels', not the no-regret choice of torch SDPA."""
    from autotune.runtime.attention import configure

    configure(
        db=f"sqlite:///{tmp_path_factory.mktemp('db')}/empty.db",
        use_shipped=False,
        untuned="kernel",
    )
    yield
    configure()
