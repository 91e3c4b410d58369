"""Decisions carried over only where they transfer (issue 38, item 2), on the shipped `db/`:

- a torch SDPA win carries over only to a problem torch runs the same way (`sdpa_path`: the
  mask it is handed, GQA, decode-sized or not); before, a square causal problem won by SDPA
  sent causal problems with Lq != Lk to SDPA's lower-right-mask path (0.56x on the H200);
- fp16 and bf16 share configs: an fp16 decode problem with GQA runs the decode90 config of its
  bf16 twin; before, it ran SDPA ("no kernel family was measured faster ... fp16 ... Lq in
  2-16"), its nearest fp16 problem being a prefill one won by SDPA;
- the region rule blocks a carried-over family only where it was timed and never faster than
  SDPA, not where it was never timed; a config carried from prefill to decode still needs a win
  measured there.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune._paths import shipped_results_files
from autotune.measure.sdpa import sdpa_path
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.model.target import target_for_arch
from autotune.runtime import dispatch as dispatch_module
from autotune.runtime.dispatch import Dispatcher

from .test_dispatch import H200, FakeKernel


@pytest.fixture
def shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dispatcher:
    """A dispatcher with an empty database of its own and the real db/ results."""
    real = [json.loads(p.read_text()) for p in shipped_results_files()]
    monkeypatch.setattr(dispatch_module, "shipped_results", lambda: real)
    d = Dispatcher(f"sqlite:///{tmp_path}/user.db")
    d._identify = lambda index: (H200, target_for_arch(90))  # type: ignore[method-assign]
    d._load = lambda config, target, index, problems: FakeKernel(config)  # type: ignore[method-assign,assignment]
    return d


def test_sdpa_paths() -> None:
    assert sdpa_path(512, 512, 16, 16, causal=True)[0] == "is_causal"
    assert sdpa_path(500, 512, 16, 16, causal=True)[0] == "lower-right"
    assert sdpa_path(700, 512, 16, 16, causal=True)[0] == "lower-right, Lq > Lk"
    assert sdpa_path(700, 512, 16, 16, causal=False)[0] == "none"
    assert sdpa_path(1, 512, 32, 8, causal=False)[1:3] == (True, True)


@pytest.mark.parametrize("lengths", [(700, 500), (400, 520)], ids=["Lq>Lk", "Lq<Lk"])
def test_a_square_causal_sdpa_win_is_not_carried_to_a_non_square_causal_problem(
    shipped: Dispatcher, lengths: tuple[int, int]
) -> None:
    # the nearest tuned problem, B16 H16 L512 D64 fp16 causal, was won by SDPA's default
    lq, lk = lengths
    problem = Problem(16, 16, 16, lq, lk, 64, "fp16", True)
    decision = shipped.decide(problem, 0)  # (seeds the database from db/)
    nearest = shipped.store().nearest(H200, problem)
    assert nearest is not None and nearest[0].config.family == "sdpa"
    assert nearest[0].problem.seqlen_q == nearest[0].problem.seqlen_k
    assert decision.config is not None and decision.config.family == "sm90", decision.describe()
    assert any("won by torch SDPA" in s and "not carried over" in s for s in decision.skipped)


def test_an_sdpa_win_carries_over_where_torch_runs_the_problem_the_same_way(
    shipped: Dispatcher,
) -> None:
    # B4 H32/8 L2048 D128 bf16 non-causal was won by SDPA (cuDNN): a GQA 4 non-causal prefill
    # near it runs the same way in torch
    decision = shipped.decide(Problem(4, 32, 8, 1900, 2100, 128, "bf16", False), 0)
    assert decision.path == "nearest" and decision.sdpa_backend is not None, decision.describe()
    assert decision.tuned_problem == Problem(4, 32, 8, 2048, 2048, 128, "bf16", False)


@pytest.mark.parametrize(
    "problem",
    [
        Problem(8, 32, 8, 8, 8192, 128, "fp16", True),
        Problem(4, 64, 8, 4, 16384, 128, "fp16", True),
        Problem(2, 32, 8, 16, 30000, 128, "fp16", True),
    ],
    ids=lambda p: p.describe(),
)
def test_fp16_decode_with_gqa_runs_the_config_of_its_bf16_twin(
    shipped: Dispatcher, problem: Problem
) -> None:
    decision = shipped.decide(problem, 0)
    assert decision.config is not None and decision.config.family == "decode90", (
        decision.describe()
    )
    assert decision.config["dtype"] == "fp16"
    assert decision.tuned_problem is not None and decision.tuned_problem.dtype == "bf16"
    assert "fp16 and bf16 share configs" in decision.reason
    load_space("decode90").validate(decision.config)  # a valid fp16 config, not a relabel


def test_a_problem_of_its_own_dtype_comes_first_at_the_same_distance(shipped: Dispatcher) -> None:
    # B16 H16 L512 D128 is tuned in both dtypes: each dtype is served by its own
    for dtype in ("fp16", "bf16"):
        decision = shipped.decide(Problem(16, 16, 16, 520, 520, 128, dtype, False), 0)
        assert decision.tuned_problem is not None and decision.tuned_problem.dtype == dtype


def test_a_prefill_config_is_still_not_carried_to_decode_without_a_win_there(
    shipped: Dispatcher,
) -> None:
    """D=64 has no decode problem tuned in either dtype: its nearest tuned problems are
    prefill ones, whose sm90 configs never ran a decode problem; SDPA's default runs it."""
    decision = shipped.decide(Problem(8, 16, 16, 1, 4096, 64, "fp16", False), 0)
    assert decision.config is not None and decision.config.family in (
        "sdpa",
        "decode",
        "decode90",
    ), decision.describe()
    assert decision.config.family != "sm90"


def test_a_kernel_that_won_by_a_tie_is_not_carried_where_torch_runs_the_same_way(
    shipped: Dispatcher,
) -> None:
    # B4 H16 L2048 D64 fp16 causal: sm90 won at 1.02x. Carried to this untuned problem it ran
    # at 0.97x of SDPA's default on the H200 (below the runtime's floor); SDPA's default there.
    decision = shipped.decide(Problem(3, 12, 12, 1531, 1531, 64, "fp16", True), 0)
    assert decision.sdpa_backend == "default", decision.describe()
    assert any("within the 1.05x a carried config needs" in s for s in decision.skipped)


def test_a_clear_win_still_carries_over(shipped: Dispatcher) -> None:
    # B1 H32/8 L8192 D128 bf16 causal: sm90 at 1.06x
    decision = shipped.decide(Problem(1, 32, 8, 6000, 6000, 128, "bf16", True), 0)
    assert decision.path == "nearest" and decision.config is not None
    assert decision.config.family == "sm90", decision.describe()


def test_a_tie_carries_where_torch_would_take_another_path(shipped: Dispatcher) -> None:
    # the same tied sm90 config, carried to causal Lq > Lk: SDPA's is_causal timing says
    # nothing of its lower-right-mask path there (2.21x and 1.67x for the kernel on the H200)
    decision = shipped.decide(Problem(2, 16, 16, 1500, 1024, 64, "fp16", True), 0)
    assert decision.config is not None and decision.config.family == "sm90", decision.describe()
