"""A short real tuning session on the GPU: compile pool, worker process, validation, timing,
SDPA baselines, re-ranking, and the database afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.model.problem import Problem
from autotune.tune.backends import GpuBackend
from autotune.tune.search import SearchSettings
from autotune.tune.tuning import best_config, tune

pytestmark = pytest.mark.gpu


def test_short_session_on_one_small_shape(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/tune.db"
    problem = Problem(2, 8, 8, 512, 512, 64, "fp16", True)
    backend = GpuBackend()
    try:
        # sm80 only: it runs on every GPU these tests run on, and compiles in seconds (an sm90
        # config takes minutes); tests/tune/test_families.py covers several families on the CPU
        (outcome,) = tune(
            problem,
            db=db,
            backend=backend,
            families=["sm80"],
            settings=SearchSettings(trials=6, batch_size=3, rerank_top=3, seed=3),
        )
        device = backend.device()
    finally:
        backend.close()
    assert outcome.best is not None and outcome.best.ok
    assert outcome.evaluated == 6 and len(outcome.finalists) >= 1
    assert {"default", "flash"} <= set(outcome.baselines)
    assert 10 < (outcome.tflops() or 0) < 1000
    answer = best_config(problem, db=db, device=device)
    assert answer is not None and answer.match == "exact"
    assert answer.record.config == outcome.best.config
    assert answer.record.median_us == outcome.best.median_us


def test_a_backward_problem_is_tuned_beside_torchs_backward(tmp_path: Path) -> None:
    """A backward problem's session: the backward family's configs through the gradient
    validator and timed against torch's backward, torch's backwards re-ranked with the
    finalists, the winner stored as the problem's own (never the forward's), and
    `backward_config` following it."""
    import json

    from autotune.runtime import training
    from autotune.runtime.attention import configure
    from autotune.store.repo import TuningStore

    db = f"sqlite:///{tmp_path}/tune.db"
    problem = Problem(2, 8, 2, 1024, 1024, 64, "bf16", True, backward=True)
    backend = GpuBackend()
    try:
        (outcome,) = tune(
            problem,
            db=db,
            backend=backend,
            settings=SearchSettings(trials=3, batch_size=3, rerank_top=2, seed=5),
        )
        device = backend.device()
    finally:
        backend.close()
    assert outcome.best is not None and outcome.best.ok
    assert outcome.best.config.family in ("bwd", "sdpa")
    assert "default" in outcome.baselines
    forward = Problem(2, 8, 2, 1024, 1024, 64, "bf16", True)
    store = TuningStore(db)
    assert store.best(device, forward) is None
    stored = store.best(device, problem)
    assert stored is not None and stored.config == outcome.best.config
    configure(db=db, use_shipped=False)
    try:
        chosen = training.backward_config(forward, 0)
    finally:
        configure()
    if outcome.best.config.family == "bwd":
        assert chosen is not None and json.loads(chosen) == outcome.best.config.as_dict()
    else:
        assert chosen is None  # torch's backward won: torch runs it
