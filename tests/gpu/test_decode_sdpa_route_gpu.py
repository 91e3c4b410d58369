"""A decode-sized call that dispatch gives to torch SDPA's default (or cuDNN) runs a backend
that builds no execution plan per key length (FlashAttention's, else the memory-efficient one):
cuDNN builds one at each new length, so a KV cache growing by a token per step paid a plan at
every step. Checked by the kernels each call runs (the profiler) and against the fp32
reference, at every step of a growing cache; a prefill-sized call keeps torch's choice."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import autotune
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.runtime.attention import configure
from autotune.runtime.dispatch import device_info
from autotune.store.records import TrialResult
from autotune.store.repo import TuningStore

from .attention_inputs import check, make

pytestmark = pytest.mark.gpu

WINNERS = {  # problem -> the SDPA backend stored as its best
    Problem(1, 32, 8, 1, 4096, 128, "bf16", True): "default",
    Problem(2, 16, 16, 4, 1000, 64, "fp16", False): "cudnn",
    Problem(1, 40, 8, 8, 2048, 128, "bf16", True): "default",
}
PREFILL = Problem(1, 8, 8, 1024, 1024, 128, "bf16", True)


@pytest.fixture(scope="module", autouse=True)
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = f"sqlite:///{tmp_path_factory.mktemp('db')}/route.db"
    store = TuningStore(db)
    for problem, backend in [*WINNERS.items(), (PREFILL, "default")]:
        config = load_space("sdpa").config(**problem.space_values(), backend=backend)
        store.set_best(
            device_info(0),
            problem,
            TrialResult(config, "ok", median_us=40.0),
            measurement_id=None,
            study="test",
            trials=1,
            sdpa_default_us=40.0,
            sdpa_flash_us=60.0,
        )
    configure(db=db, use_shipped=False)
    yield db
    configure()


def _kernels(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    """fn's result, and the names of the CUDA kernels it ran."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = fn(*args, **kwargs)
        torch.cuda.synchronize()
    return out, [e.key.lower() for e in prof.key_averages() if e.device_type.name == "CUDA"]


@pytest.mark.parametrize("problem", list(WINNERS), ids=lambda p: p.describe())
def test_a_growing_cache_runs_a_backend_without_a_plan_per_length(problem: Problem) -> None:
    routed = 0
    for step in range(6):
        grown = replace(problem, seqlen_k=problem.seqlen_k + step)
        q, k, v = make(grown)
        decision = autotune.explain(q, k, v, causal=grown.causal)
        assert step > 0 or decision.sdpa_backend == WINNERS[problem]
        out, names = _kernels(autotune.attention, q, k, v, causal=grown.causal)
        assert not any("cudnn" in n for n in names), names
        if decision.sdpa_backend in ("default", "cudnn"):
            assert any("flash" in n or "fmha" in n for n in names), names
            routed += 1
        check(out, q, k, v, grown, "bhld", fp16_tol=2e-3, bf16_tol=1e-2)
    assert routed >= 1


def test_a_prefill_call_keeps_torch_s_choice() -> None:
    q, k, v = make(PREFILL)
    routed, names = _kernels(autotune.attention, q, k, v, causal=True)
    direct, torch_names = _kernels(
        torch.nn.functional.scaled_dot_product_attention, q, k, v, is_causal=True
    )
    assert sorted(set(names)) == sorted(set(torch_names))
    torch.testing.assert_close(routed, direct, rtol=0, atol=0)
