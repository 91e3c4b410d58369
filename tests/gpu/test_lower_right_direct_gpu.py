"""On the GPU: a causal 1 < Lq != Lk call that dispatch hands to torch SDPA runs the aten op
torch's lower-right bias picks, resolved once, with the same bits as torch's own call of the
bias, under each backend's switches, in both layouts; a call made after the caller changed
torch's SDPA switches follows them; and the output matches the fp32 reference."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from autotune.measure.sdpa import sdpa_call
from autotune.model.problem import Problem
from autotune.runtime.attention import _SdpaRun

from .attention_inputs import check, make

pytestmark = pytest.mark.gpu

PROBLEMS = [
    Problem(2, 8, 2, 7, 333, 64, "fp16", True),  # GQA, decode-sized
    Problem(1, 32, 8, 16, 4100, 128, "bf16", True),  # a speculative verify step
    Problem(3, 12, 1, 129, 515, 96, "bf16", True),  # MQA, D=96
    Problem(2, 8, 4, 9, 421, 256, "bf16", True),  # D=256
    Problem(2, 4, 4, 300, 77, 128, "fp16", True),
]  # Lq > Lk: rows that see no key


@pytest.mark.parametrize("layout", ["bhld", "blhd"])
@pytest.mark.parametrize("backend", ["default", "flash", "efficient"])
@pytest.mark.parametrize("problem", PROBLEMS, ids=[p.describe() for p in PROBLEMS])
def test_direct_op_gives_torchs_bits(problem: Problem, backend: str, layout: str) -> None:
    q, k, v = make(problem, layout)
    try:
        expected = sdpa_call(backend, q, k, v, causal=True, layout=layout)()
    except RuntimeError:
        pytest.skip(f"torch's {backend} backend refuses {problem.describe()}")
    if layout == "blhd":
        expected = expected.transpose(1, 2)
    run = _SdpaRun(backend, problem, True, None, layout, 0, (q, k, v))
    out = run(q, k, v, False)
    # torch's memory-efficient op leaves NaN in the rows of Lq > Lk that see no key: the same
    # NaN either way (the tuner's validation keeps that backend from winning such a problem)
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
    if problem.seqlen_q <= problem.seqlen_k or backend != "efficient":
        check(out, q, k, v, problem, layout, fp16_tol=2e-3, bf16_tol=1e-2)
    if backend == "flash":  # every problem here is one FlashAttention takes
        assert run._call is not run._general


def test_changed_switches_are_followed() -> None:
    problem = Problem(2, 8, 8, 16, 600, 128, "fp16", True)  # no GQA: the efficient op takes it
    q, k, v = make(problem)
    run = _SdpaRun("default", problem, True, None, "bhld", 0, (q, k, v))
    assert run._call is not run._general
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        expected = sdpa_call("default", q, k, v, causal=True)()
        out = run(q, k, v, False)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
