"""The gradient validator (measure/validate_backward.py) and its reference
(measure/reference_backward.py) on the CPU: the reference against fp64 autograd, torch's own
backward passing in fp16 and bf16, and backwards broken the ways kernels break failing, each
with its reason."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from autotune.launch.tensors import logical_bhld
from autotune.measure.reference_backward import reference_gradients
from autotune.measure.validate import DEFAULT_CASES
from autotune.measure.validate_backward import validate_backward

from ..conftest import LONG

# every case but the largest (its CPU backward takes most of the time) unless the long run
EVERY = tuple(c for c in DEFAULT_CASES if LONG or c.name != "many_tiles_per_sm_gqa4")
# the cases the broken backwards are shown on (small, GQA, Lq > Lk, a single key, blhd)
SOME = tuple(
    c
    for c in DEFAULT_CASES
    if c.name in ("aligned", "single_query_single_key", "gqa4_blhd", "lq300_gt_lk77")
)


def _autograd_fp64(q, k, v, dout, causal: bool, layout: str):  # type: ignore[no-untyped-def]
    leaves = [logical_bhld(t, layout).double().requires_grad_() for t in (q, k, v)]
    qb, kb, vb = leaves
    group = qb.shape[1] // kb.shape[1]
    kx, vx = kb.repeat_interleave(group, 1), vb.repeat_interleave(group, 1)
    scores = qb @ kx.transpose(-1, -2) / math.sqrt(qb.shape[-1])
    if causal:
        lq, lk = qb.shape[2], kb.shape[2]
        hidden = torch.arange(lk)[None, :] > torch.arange(lq)[:, None] + (lk - lq)
        scores = scores.masked_fill(hidden, float("-inf"))
    out = torch.softmax(scores, -1).nan_to_num(0.0) @ vx
    out.backward(logical_bhld(dout, layout).double())
    return [t.grad for t in leaves]


@pytest.mark.parametrize(
    "b, hq, hkv, lq, lk, causal, layout",
    [
        (2, 4, 2, 5, 9, True, "bhld"),
        (1, 3, 3, 7, 7, False, "blhd"),
        (1, 4, 1, 9, 4, True, "bhld"),  # Lq > Lk: queries that see no key
        (2, 2, 2, 1, 13, True, "blhd"),
    ],
)
def test_the_reference_is_autograd_s_gradient(
    b: int, hq: int, hkv: int, lq: int, lk: int, causal: bool, layout: str
) -> None:
    gen = torch.Generator().manual_seed(1)

    def shaped(h: int, n: int) -> torch.Tensor:
        shape = (b, h, n, 8) if layout == "bhld" else (b, n, h, 8)
        return torch.randn(shape, generator=gen)

    q, k, v, dout = shaped(hq, lq), shaped(hkv, lk), shaped(hkv, lk), shaped(hq, lq)
    ours = reference_gradients(q, k, v, dout, causal=causal, scale=1 / math.sqrt(8), layout=layout)
    for got, want in zip(ours, _autograd_fp64(q, k, v, dout, causal, layout), strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def torch_backward(
    causal: bool, damage: Callable[[dict[str, torch.Tensor]], None] | None = None
) -> Callable[..., None]:
    """A runner: torch SDPA's forward and backward (the CPU's), its gradients written into the
    validator's outputs, then `damage` applied to them (dq, dk, dv as [B, H, L, D] views)."""

    def run(
        q: Any, k: Any, v: Any, dout: Any, *, dq: Any, dk: Any, dv: Any, scale: float, layout: str
    ) -> None:
        leaves = [logical_bhld(t, layout).detach().clone().requires_grad_() for t in (q, k, v)]
        qb, kb, vb = leaves
        lq, lk = qb.shape[2], kb.shape[2]
        kwargs: dict[str, Any] = {}
        with warnings.catch_warnings():  # a lower-right bias with Lq > Lk: NaN rows, zeroed
            warnings.simplefilter("ignore")
            if causal and lq == lk:
                kwargs = {"is_causal": True}
            elif causal:
                kwargs = {"attn_mask": causal_lower_right(lq, lk)}
            out = F.scaled_dot_product_attention(
                qb, kb, vb, scale=scale, enable_gqa=qb.shape[1] != kb.shape[1], **kwargs
            )
        out.nan_to_num(0.0).backward(logical_bhld(dout, layout))
        grads = {
            "dq": logical_bhld(dq, layout),
            "dk": logical_bhld(dk, layout),
            "dv": logical_bhld(dv, layout),
        }
        for name, leaf in zip(("dq", "dk", "dv"), leaves, strict=True):
            grads[name].copy_(leaf.grad.nan_to_num(0.0))
        if damage is not None:
            damage(grads)

    return run


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_torch_s_own_backward_passes(dtype: str, causal: bool) -> None:
    report = validate_backward(
        torch_backward(causal),
        head_dim=64,
        dtype=dtype,
        causal=causal,
        device="cpu",
        seed=3,
        cases=EVERY,
    )
    assert report.passed, report.summary()
    assert report.worst_share() < 1 and all(c.identical_runs for c in report.cases)


def _unwritten_dk(grads: dict[str, torch.Tensor]) -> None:
    grads["dk"][:, :, -1] = math.nan


def _scaled_dq(grads: dict[str, torch.Tensor]) -> None:
    grads["dq"].mul_(1.05)


def _group_not_summed(grads: dict[str, torch.Tensor]) -> None:
    grads["dk"].mul_(0.5)  # as if half the query heads of each group were left out


@pytest.mark.parametrize(
    "damage, reason",
    [(_unwritten_dk, "dk elements are NaN"), (_scaled_dq, "dq"), (_group_not_summed, "dk")],
)
def test_a_broken_backward_fails_with_its_reason(
    damage: Callable[[dict[str, torch.Tensor]], None], reason: str
) -> None:
    report = validate_backward(
        torch_backward(True, damage),
        head_dim=64,
        dtype="bf16",
        causal=True,
        device="cpu",
        seed=5,
        cases=SOME,
    )
    assert not report.passed
    assert all(reason in c.reason for c in report.failures), report.summary()


def test_the_wrong_causal_alignment_fails() -> None:
    """Causal aligned top-left (torch's is_causal with Lq != Lk) instead of bottom-right."""

    def run(q: Any, k: Any, v: Any, dout: Any, **kwargs: Any) -> None:
        qb = logical_bhld(q, kwargs["layout"])
        kb = logical_bhld(k, kwargs["layout"])
        top_left = torch.ones(qb.shape[2], kb.shape[2], dtype=torch.bool).tril()
        saved = F.scaled_dot_product_attention

        def top_left_sdpa(*args: Any, **kw: Any) -> Any:
            kw.pop("is_causal", None)
            kw["attn_mask"] = top_left
            return saved(*args, **kw)

        F.scaled_dot_product_attention = top_left_sdpa  # type: ignore[assignment]
        try:
            torch_backward(True)(q, k, v, dout, **kwargs)
        finally:
            F.scaled_dot_product_attention = saved

    lq300 = tuple(c for c in SOME if c.name == "lq300_gt_lk77")
    report = validate_backward(
        run, head_dim=64, dtype="fp16", causal=True, device="cpu", seed=5, cases=lq300
    )
    assert not report.passed and "launch failed" not in report.summary(), report.summary()


def test_a_write_past_a_gradient_fails() -> None:
    def run(q: Any, k: Any, v: Any, dout: Any, *, dq: Any, **kwargs: Any) -> None:
        torch_backward(True)(q, k, v, dout, dq=dq, **kwargs)
        assert kwargs["layout"] == "bhld"
        # the first element after head 0's last row: the padding the validator put there
        past = dq.storage_offset() + dq.shape[2] * dq.shape[3]
        torch.as_strided(dq, (1,), (1,), past).fill_(0.0)

    report = validate_backward(
        run, head_dim=64, dtype="fp16", causal=True, device="cpu", seed=5, cases=SOME[:1]
    )
    assert not report.passed and "outside dq" in report.summary()


def test_runs_that_differ_fail_only_the_deterministic_mode() -> None:
    calls = [0]

    def noisy(grads: dict[str, torch.Tensor]) -> None:
        calls[0] += 1
        grads["dq"].add_(calls[0] * 1e-7)  # a last-bit difference, as atomics leave

    report = validate_backward(
        torch_backward(False, noisy),
        head_dim=64,
        dtype="fp16",
        causal=False,
        device="cpu",
        seed=5,
        cases=SOME[:1],
    )
    assert report.passed and report.cases[0].identical_runs is False
    strict = validate_backward(
        torch_backward(False, noisy),
        head_dim=64,
        dtype="fp16",
        causal=False,
        device="cpu",
        seed=5,
        cases=SOME[:1],
        deterministic=True,
    )
    assert not strict.passed and "differ" in strict.summary()
