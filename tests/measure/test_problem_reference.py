from __future__ import annotations

import ast
import itertools
import math
from pathlib import Path

import pytest
import torch

import autotune
from autotune.launch.tensors import read_problem
from autotune.measure.reference import reference_attention
from autotune.measure.validate import DEFAULT_CASES
from autotune.model.problem import Problem


def brute_visible(p: Problem) -> int:
    return sum(
        1
        for i in range(p.seqlen_q)
        for j in range(p.seqlen_k)
        if not p.causal or j <= i + p.seqlen_k - p.seqlen_q
    )


@pytest.mark.parametrize("lq, lk", list(itertools.product([1, 2, 7, 33], [1, 5, 33, 40])))
def test_visible_pairs_bottom_right(lq: int, lk: int) -> None:
    for causal in (False, True):
        p = Problem(1, 1, 1, lq, lk, 64, "fp16", causal)
        assert p.visible_pairs == brute_visible(p)


def test_flops_count_only_unmasked_work() -> None:
    full = Problem(4, 16, 16, 2048, 2048, 128)
    assert full.flops == 4 * 4 * 16 * 2048 * 2048 * 128
    causal = Problem(4, 16, 16, 2048, 2048, 128, causal=True)
    assert causal.flops == 4 * 4 * 16 * 128 * (2048 * 2049 // 2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"heads_q": 6, "heads_kv": 4}, "multiple"),
        ({"seqlen_q": 0}, "from 1 to 2\\^31-1"),
        ({"seqlen_k": 2**31}, "from 1 to 2\\^31-1"),
        ({"dtype": "fp32"}, "dtype"),
        ({"causal": 1}, "bool"),
    ],
)
def test_problem_rejects_bad_values(kwargs: dict[str, object], message: str) -> None:
    values = {
        "batch": 1,
        "heads_q": 4,
        "heads_kv": 4,
        "seqlen_q": 8,
        "seqlen_k": 8,
        "head_dim": 64,
        **kwargs,
    }
    with pytest.raises(ValueError, match=message):
        Problem(**values)  # type: ignore[arg-type]


def naive(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-by-row float64 attention, written independently of the reference's vectorised form."""
    b, h, lq, _ = q.shape
    g = h // k.shape[1]
    lk = k.shape[2]
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((b, h, lq), -math.inf, dtype=torch.float64)
    for bi, hi, i in itertools.product(range(b), range(h), range(lq)):
        keys = [j for j in range(lk) if not causal or j <= i + lk - lq]
        if not keys:
            continue
        s = torch.stack([q[bi, hi, i].double() @ k[bi, hi // g, j].double() for j in keys]) * scale
        lse[bi, hi, i] = torch.logsumexp(s, 0)
        w = torch.softmax(s, 0)
        out[bi, hi, i] = sum(w[n] * v[bi, hi // g, j].double() for n, j in enumerate(keys))
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lq, lk", [(5, 9), (9, 5), (6, 6)])
def test_reference_matches_naive_with_gqa(causal: bool, lq: int, lk: int) -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, lq, 16, generator=gen)
    k = torch.randn(2, 2, lk, 16, generator=gen)
    v = torch.randn(2, 2, lk, 16, generator=gen)
    out, lse = reference_attention(q, k, v, causal=causal, scale=0.4)
    want_out, want_lse = naive(q, k, v, causal, 0.4)
    torch.testing.assert_close(out.double(), want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)
    if causal and lq > lk:  # rows 0 .. lq-lk-1 see no key
        assert bool((out[:, :, : lq - lk] == 0).all())
        assert bool(torch.isneginf(lse[:, :, : lq - lk]).all())


def test_reference_reads_blhd_without_copy_semantics_change() -> None:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 7, 3, 16, generator=gen)  # [B, L, H, D]
    k = torch.randn(1, 11, 3, 16, generator=gen)
    v = torch.randn(1, 11, 3, 16, generator=gen)
    out_blhd, _ = reference_attention(q, k, v, causal=True, scale=0.25, layout="blhd")
    out_bhld, _ = reference_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, scale=0.25
    )
    torch.testing.assert_close(out_blhd, out_bhld)


def test_tensors_pose_a_problem_in_either_layout() -> None:
    q, k = (
        torch.empty(2, 8, 33, 64, dtype=torch.bfloat16),
        torch.empty(2, 2, 65, 64, dtype=torch.bfloat16),
    )
    want = Problem(2, 8, 2, 33, 65, 64, "bf16", True)
    assert read_problem(q, k, k, causal=True) == want
    blhd = [t.transpose(1, 2) for t in (q, k)]
    assert read_problem(blhd[0], blhd[1], blhd[1], causal=True, layout="blhd") == want


def test_a_validation_case_is_a_problem_given_the_kernel_class() -> None:
    case = next(c for c in DEFAULT_CASES if c.name == "mqa_lq333_lk517")
    problem = case.problem(128, "bf16", True)
    assert problem == Problem(1, 6, 1, 333, 517, 128, "bf16", True)
    assert problem.space_values() == {"head_dim": 128, "dtype": "bf16", "causal": True}


def test_problem_is_the_one_type_that_declares_a_problem_shape() -> None:
    """No second shape type: a class of the package that declares the sizes of a problem is
    Problem (the database's row of one, store.models.ProblemRow, maps it to columns)."""
    package = Path(autotune.__file__).parent
    declaring = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(s, ast.AnnAssign)
                and isinstance(s.target, ast.Name)
                and s.target.id in ("seqlen_q", "heads_kv")
                for s in node.body
            ):
                declaring.append(f"{path.relative_to(package)}:{node.name}")
    assert set(declaring) <= {"model/problem.py:Problem", "store/models.py:ProblemRow"}
    assert "model/problem.py:Problem" in declaring
