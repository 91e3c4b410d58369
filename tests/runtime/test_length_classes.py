"""Dispatch decides per length class, not per length, and every runtime memo is bounded
(issue 38, item 1: a KV cache that grows by a token per step made a new decision, with its
database queries, at every step, and the memos grew without bound).

Before: 10^5 lengths of a growing cache made 10^5 decisions and 10^5 memo entries."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from autotune._bounded import LruDict
from autotune._paths import shipped_results_files
from autotune.model.buckets import (
    EXACT_UP_TO,
    class_bounds,
    length_class,
    representative,
    representative_length,
)
from autotune.model.problem import Problem
from autotune.model.target import target_for_arch
from autotune.runtime import dispatch as dispatch_module
from autotune.runtime.dispatch import Dispatcher

from .test_dispatch import H200, FakeKernel, tuned

DECODE = Problem(1, 32, 8, 1, 4096, 128, "bf16", True)


def test_every_length_lies_in_its_class_and_classes_are_few() -> None:
    classes = set()
    for length in range(1, 100_001):
        index = length_class(length)
        lower, upper = class_bounds(index)
        assert lower <= length <= upper
        assert length_class(representative_length(length)) == index
        classes.add(index)
    assert len(classes) < 150
    assert all(length_class(n) == n for n in range(1, EXACT_UP_TO + 1))
    # each class above the exact ones spans about 9% of its lengths
    lower, upper = class_bounds(length_class(50_000))
    assert 1.08 < (upper + 1) / lower < 1.10


def test_a_representative_keeps_what_torch_and_the_mask_depend_on() -> None:
    rng = random.Random(7)
    for _ in range(5000):
        lq = rng.randint(1, 40_000)
        lk = rng.choice([lq, lq + 1, max(1, lq - 1), rng.randint(1, 40_000)])
        page = rng.choice([0, 16, 64])
        lk = max(page, lk // page * page) if page else lk
        problem = Problem(
            2, 16, 4, lq, lk, 128, "fp16", rng.random() < 0.5, f"paged{page}" if page else "dense"
        )
        rep = representative(problem)
        assert (rep.seqlen_q > rep.seqlen_k) == (lq > lk), (problem, rep)
        assert (rep.seqlen_q == rep.seqlen_k) == (lq == lk), (problem, rep)
        assert rep.seqlen_k % (page or 1) == 0
        assert rep.batch == 2 and rep.heads_kv == 4 and rep.causal == problem.causal
        assert length_class(rep.seqlen_k) == length_class(lk) or page


@pytest.fixture
def dispatcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dispatcher:
    monkeypatch.setattr(dispatch_module, "shipped_results", lambda: [])
    d = Dispatcher(f"sqlite:///{tmp_path}/user.db", untuned="kernel")
    d._identify = lambda index: (H200, target_for_arch(90))  # type: ignore[method-assign]
    d._load = lambda config, target, index, problems: FakeKernel(config)  # type: ignore[method-assign,assignment]
    return d


def _counting(d: Dispatcher) -> list[Problem]:
    decided: list[Problem] = []
    decide = d._decide

    def counted(problem: Problem, index: int) -> Any:
        decided.append(problem)
        return decide(problem, index)

    d._decide = counted  # type: ignore[method-assign]
    return decided


def test_a_growing_kv_cache_makes_a_decision_per_class_not_per_step(
    dispatcher: Dispatcher,
) -> None:
    tuned_at = Problem(1, 32, 8, 1, 8192, 128, "bf16", True)
    config = tuned(dispatcher.db, tuned_at, 30.0)
    decided = _counting(dispatcher)
    paths = {}
    for length in range(1024, 101_024):  # 10^5 decode steps, a token each
        decision = dispatcher.decide(Problem(1, 32, 8, 1, length, 128, "bf16", True), 0)
        paths[length] = decision.path
    classes = {length_class(n) for n in range(1024, 101_024)}
    assert len(decided) == len(classes) + 1 < 60  # + the tuned problem, decided as itself
    assert dispatcher.db_queries <= len(decided) + 1  # + reading which problems are tuned
    # the problem tuned as it is stays exact; its neighbours are served by it, as nearest
    assert paths[8192] == "exact" and paths[8191] == paths[8193] == "nearest"
    assert dispatcher.decide(tuned_at, 0).config == config
    assert len(dispatcher._memo) == len(decided)


def test_a_class_whose_representative_is_tuned_is_nearest_for_the_others(
    dispatcher: Dispatcher,
) -> None:
    asked = Problem(1, 32, 8, 1, 5000, 128, "bf16", True)
    rep = representative(asked)
    tuned(dispatcher.db, rep, 30.0)
    assert dispatcher.decide(rep, 0).path == "exact"
    other = dispatcher.decide(asked, 0)
    assert other.path == "nearest" and other.tuned_problem == rep
    assert "representative of this length class" in other.reason
    assert dispatcher.decide(rep, 0).path == "exact"  # the two are remembered apart


def test_the_memos_keep_the_most_recently_used_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatch_module, "MEMO_SIZE", 8)
    monkeypatch.setattr(dispatch_module, "shipped_results", lambda: [])
    d = Dispatcher(f"sqlite:///{tmp_path}/user.db", untuned="kernel")
    d._identify = lambda index: (H200, target_for_arch(90))  # type: ignore[method-assign]
    d._load = lambda config, target, index, problems: FakeKernel(config)  # type: ignore[method-assign,assignment]
    for batch in range(1, 101):
        d.decide(Problem(batch, 32, 8, 1, 4096, 128, "bf16", True), 0)
        d.tuned_config(Problem(batch, 32, 8, 1, 4096, 128, "bf16", True), 0, "decode90")
    assert len(d._memo) == 8 and len(d._family_memo) == 8
    decided = _counting(d)
    d.decide(Problem(100, 32, 8, 1, 4096, 128, "bf16", True), 0)  # recent: remembered
    d.decide(Problem(1, 32, 8, 1, 4096, 128, "bf16", True), 0)  # dropped: decided again
    assert [p.batch for p in decided] == [1]


def test_lru_dict() -> None:
    memo: LruDict[int, str] = LruDict(3)
    for key in range(3):
        memo[key] = str(key)
    assert memo.get(0) == "0"  # 0 is now the most recent
    memo[3] = "3"
    assert 1 not in memo and memo.get(1) is None and len(memo) == 3
    assert memo.setdefault(0, "x") == "0" and memo.setdefault(9, "9") == "9"
    assert 2 not in memo
    with pytest.raises(ValueError):
        LruDict(0)


def test_every_shipped_problem_is_still_decided_as_itself(
    dispatcher: Dispatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The change keeps db/'s decisions: each shipped problem is tuned, so it is decided as
    itself (exact), with the stored config, whatever its length class."""
    real = [json.loads(p.read_text()) for p in shipped_results_files()]
    monkeypatch.setattr(dispatch_module, "shipped_results", lambda: real)
    entries = [e for data in real for e in data["results"] if e["device"]["name"] == H200.name]
    assert len(entries) > 100
    for entry in entries:
        problem = Problem(**entry["problem"])
        decided_for, tuned_as_is = dispatcher.decision_problem(problem, 0)
        assert tuned_as_is and decided_for == problem
        decision = dispatcher.decide(problem, 0)
        assert decision.path == "exact", (problem, decision.describe())
        assert decision.config is not None and dict(decision.config.values) == {
            k: v for k, v in entry["config"].items() if k != "family"
        }
