"""The validator itself, on the CPU, with runners that are right and runners that are wrong in
the ways kernels go wrong. A validator that passes a broken runner is worthless."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from autotune.launch.tensors import logical_bhld
from autotune.measure.reference import reference_attention
from autotune.measure.validate import DEFAULT_CASES, validate

CPU = torch.device("cpu")


def make_runner(
    causal: bool,
    mutate: Callable[..., None] | None = None,
    top_left: bool = False,
    fixed_scale: float | None = None,
) -> Callable[..., None]:
    calls = {"n": 0}

    def run(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        out: torch.Tensor,
        lse: torch.Tensor | None,
        scale: float,
        layout: str,
    ) -> None:
        calls["n"] += 1
        qq, kk, vv = q, k, v
        if top_left and causal:  # the classic mistake: torch's is_causal alignment
            lq, lk = logical_bhld(q, layout).shape[2], logical_bhld(k, layout).shape[2]
            if lk > lq:
                kk = logical_bhld(k, layout)[:, :, :lq]
                vv = logical_bhld(v, layout)[:, :, :lq]
                if layout == "blhd":
                    kk, vv = kk.transpose(1, 2), vv.transpose(1, 2)
        ref_out, ref_lse = reference_attention(
            qq, kk, vv, causal=causal, scale=fixed_scale or scale, layout=layout
        )
        logical_bhld(out, layout).copy_(ref_out.to(out.dtype))
        if lse is not None:
            lse.copy_(ref_lse)
        if mutate is not None:
            mutate(out=out, lse=lse, layout=layout, call=calls["n"])

    return run


def run_validate(runner: Callable[..., None], causal: bool = True, dtype: str = "fp16"):
    return validate(runner, head_dim=32, dtype=dtype, causal=causal, device=CPU, seed=7)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_a_correct_runner_passes_every_case(causal: bool, dtype: str) -> None:
    report = run_validate(make_runner(causal), causal, dtype)
    assert report.passed, report.summary()
    assert len(report.cases) == len(DEFAULT_CASES) >= 8
    assert report.seed == 7


def failing_case_reasons(report) -> str:  # type: ignore[no-untyped-def]
    assert not report.passed
    return " | ".join(c.reason for c in report.failures)


def test_unwritten_rows_fail_as_nan() -> None:
    def skip_last_row(out: torch.Tensor, layout: str, **_: object) -> None:
        logical_bhld(out, layout)[:, :, -1:] = float("nan")

    assert "NaN" in failing_case_reasons(run_validate(make_runner(True, skip_last_row)))


def test_writes_past_the_last_row_are_caught() -> None:
    def overrun(out: torch.Tensor, layout: str, **_: object) -> None:
        view = logical_bhld(out, layout)
        b, h, lq, d = view.shape
        wider = view.as_strided((b, h, lq + 1, d), view.stride())
        wider[:, :, lq] = 0.0

    assert "outside the output" in failing_case_reasons(run_validate(make_runner(True, overrun)))


def test_unwritten_lse_fails() -> None:
    def no_lse(lse: torch.Tensor | None, **_: object) -> None:
        if lse is not None:
            lse[..., 0] = float("nan")

    assert "LSE" in failing_case_reasons(run_validate(make_runner(False, no_lse), causal=False))


def test_nondeterminism_is_reported_as_a_race() -> None:
    def jitter(out: torch.Tensor, layout: str, call: int, **_: object) -> None:
        if call % 2 == 0:
            view = logical_bhld(out, layout)
            view[0, 0, 0, 0] = view[0, 0, 0, 0] + 0.125

    assert "race" in failing_case_reasons(run_validate(make_runner(False, jitter), causal=False))


def test_top_left_causal_alignment_is_wrong() -> None:
    reasons = failing_case_reasons(run_validate(make_runner(True, top_left=True)))
    assert "error" in reasons


def test_ignoring_the_scale_is_caught() -> None:
    # only one case passes a scale other than 1/sqrt(D); it must be the one that fails
    report = run_validate(make_runner(False, fixed_scale=32**-0.5), causal=False)
    assert [c.case for c in report.failures] == ["concentrated_softmax"]


def test_small_errors_in_one_row_are_caught() -> None:
    def nudge(out: torch.Tensor, layout: str, **_: object) -> None:
        view = logical_bhld(out, layout)
        view[:, :, -1] = view[:, :, -1] * 1.05  # the last query row 5% off

    reasons = failing_case_reasons(run_validate(make_runner(False, nudge), causal=False))
    assert "error" in reasons


def test_a_launch_exception_is_a_failed_case_not_a_crash() -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("CUDA_ERROR_ILLEGAL_ADDRESS")

    report = run_validate(boom)
    assert all("launch failed" in c.reason for c in report.cases)
