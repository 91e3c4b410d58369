"""A backward problem (`Problem.backward`, `Problem.deterministic`): the gradients of an
attention problem are a problem of their own, checked like its sizes, counted in backward
FLOPs, read from shape sets, and only a backward family's config (or torch's SDPA) is of its
class (`class_mismatch`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune.model.problem import Problem
from autotune.model.shapes import load_shape_set
from autotune.model.space import class_mismatch, load_space

SHAPE = (2, 32, 8, 4096, 4096, 128, "bf16", True)


def test_the_backward_is_another_problem_counted_in_backward_flops() -> None:
    forward = Problem(*SHAPE)
    backward = Problem(*SHAPE, backward=True)
    deterministic = Problem(*SHAPE, backward=True, deterministic=True)
    assert len({forward, backward, deterministic}) == 3
    assert backward.flops == forward.flops * 5 // 2 == deterministic.flops
    assert backward.tflops(1000.0) == pytest.approx(2.5 * forward.tflops(1000.0))
    assert "backward" not in forward.describe()
    assert backward.describe().endswith(" backward")
    assert deterministic.describe().endswith(" backward deterministic")
    for problem in (forward, backward, deterministic):
        assert Problem(**problem.as_dict()) == problem
    # the values every family has stay the class's; the pass is the problem's own
    assert backward.space_values() == forward.space_values()


@pytest.mark.parametrize(
    "values, fragment",
    [
        ({"deterministic": True}, "deterministic is a mode of the backward pass"),
        ({"backward": 1}, "backward must be a bool, got 1"),
        ({"backward": "yes"}, "backward must be a bool"),
        ({"backward": True, "deterministic": None}, "deterministic must be a bool"),
        ({"backward": True, "kv_cache": "paged64"}, "a backward problem has dense keys"),
        ({"backward": True, "kv_cache": "seqlens"}, "a backward problem has dense keys"),
    ],
)
def test_a_malformed_pass_is_refused(values: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        Problem(*SHAPE, **values)


def _bwd(deterministic: bool = False) -> Any:
    return load_space("bwd").heuristic(
        {"head_dim": 128, "dtype": "bf16", "causal": True, "deterministic": deterministic}
    )


def test_only_a_backward_familys_config_or_sdpa_is_of_a_backward_problems_class() -> None:
    forward = Problem(*SHAPE)
    backward = Problem(*SHAPE, backward=True)
    deterministic = Problem(*SHAPE, backward=True, deterministic=True)
    sm90 = load_space("sm90").heuristic(forward.space_values())
    sdpa = load_space("sdpa").heuristic(forward.space_values())
    assert class_mismatch(forward, sm90) == {}
    assert class_mismatch(backward, sm90) == {"backward": True}
    assert class_mismatch(backward, _bwd()) == {}
    assert class_mismatch(forward, _bwd()) == {"backward": False}
    assert class_mismatch(deterministic, _bwd(True)) == {}
    assert class_mismatch(deterministic, _bwd()) == {"deterministic": True}
    assert class_mismatch(backward, _bwd(True)) == {"deterministic": False}
    assert class_mismatch(forward, sdpa) == class_mismatch(backward, sdpa) == {}
    other = Problem(2, 32, 8, 4096, 4096, 64, "bf16", True, backward=True)
    assert class_mismatch(other, _bwd()) == {"head_dim": 64}
    assert load_space("bwd").problem_values(deterministic) == {
        "head_dim": 128,
        "dtype": "bf16",
        "causal": True,
        "deterministic": True,
    }


def test_a_shape_set_may_ask_for_the_backward(tmp_path: Path) -> None:
    path = tmp_path / "train.toml"
    path.write_text(
        'dtypes = ["bf16"]\nhead_dims = [128]\ncausal = [true]\n'
        "[[shapes]]\nbatch = 4\nheads_q = 32\nheads_kv = 8\nseqlen = 4096\n"
        "backward = [false, true]\n"
        "[[shapes]]\nbatch = 4\nheads_q = 32\nheads_kv = 8\nseqlen = 2048\n"
        "backward = true\ndeterministic = true\n"
    )
    problems = load_shape_set(str(path))
    assert [(p.seqlen_q, p.backward, p.deterministic) for p in problems] == [
        (4096, False, False),
        (4096, True, False),
        (2048, True, True),
    ]
    broken = tmp_path / "broken.toml"
    broken.write_text(
        'dtypes = ["bf16"]\nhead_dims = [128]\ncausal = [true]\n'
        '[[shapes]]\nbatch = 4\nheads_q = 8\nseqlen = 64\nbackward = "yes"\n'
    )
    with pytest.raises(ValueError, match="backward must be a bool"):
        load_shape_set(str(broken))
