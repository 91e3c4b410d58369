"""A decode-sized call that dispatch gives to torch SDPA's default leaves it once its geometry is
seen growing: torch's default builds an execution plan per new key length there (cuDNN's path
with a split reduction), so a KV cache growing by a token per step paid a plan at every step.
The growing geometry runs cuDNN named alone (no plan per length), else flash, else the
memory-efficient backend; a call at one length, a named backend and a prefill-sized call keep
theirs. Checked through the per-geometry memo (the backend each call runs), the CUDA kernels it
ran (the profiler, for the prefill call) and the fp32 reference at every step."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import autotune
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.runtime import attention as attention_module
from autotune.runtime.attention import configure
from autotune.runtime.dispatch import device_info
from autotune.store.records import TrialResult
from autotune.store.repo import TuningStore

from .attention_inputs import check, make

pytestmark = pytest.mark.gpu

DEFAULT_WINS = [
    Problem(1, 32, 8, 1, 4096, 128, "bf16", True),
    Problem(1, 40, 8, 8, 2048, 128, "bf16", True),
    Problem(8, 32, 8, 1, 2048, 128, "fp16", True),
]
CUDNN_WINS = Problem(2, 16, 16, 4, 1000, 64, "fp16", False)
PREFILL = Problem(1, 8, 8, 1024, 1024, 128, "bf16", True)


@pytest.fixture(scope="module", autouse=True)
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = f"sqlite:///{tmp_path_factory.mktemp('db')}/route.db"
    store = TuningStore(db)
    wins = [(p, "default") for p in DEFAULT_WINS] + [(CUDNN_WINS, "cudnn"), (PREFILL, "default")]
    for problem, backend in wins:
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


def _kernels(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, set[str]]:
    """fn's result, and the names of the CUDA kernels it ran."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = fn(*args, **kwargs)
        torch.cuda.synchronize()
    return out, {e.key for e in prof.key_averages() if e.device_type.name == "CUDA"}


def _backend_run(q: Any, k: Any, v: Any, causal: bool) -> str:
    """The SDPA backend the memo holds for these inputs' geometry (the one their call ran)."""
    key = (
        q.shape,
        q.stride(),
        k.shape,
        k.stride(),
        v.shape,
        v.stride(),
        q.dtype,
        q.device,
        causal,
        None,
        "bhld",
    )
    prepared = attention_module._prepared.get(key)
    assert prepared is not None and prepared.sdpa is not None
    return str(prepared.sdpa.backend)


@pytest.mark.parametrize("problem", DEFAULT_WINS, ids=lambda p: p.describe())
def test_a_growing_cache_leaves_the_default_after_its_first_length(problem: Problem) -> None:
    for step in range(6):
        grown = replace(problem, seqlen_k=problem.seqlen_k + step)
        q, k, v = make(grown)  # a new contiguous tensor each step, as torch.cat gives
        assert autotune.explain(q, k, v, causal=grown.causal).sdpa_backend == "default"
        out = autotune.attention(q, k, v, causal=grown.causal)
        # (cuDNN named may run the default's very kernels: what differs is the plan per length)
        assert _backend_run(q, k, v, grown.causal) == ("default" if step == 0 else "cudnn")
        check(out, q, k, v, grown, "bhld", fp16_tol=2e-3, bf16_tol=1e-2)


def test_one_length_a_named_backend_and_prefill_keep_theirs() -> None:
    problem = DEFAULT_WINS[0]
    q, k, v = make(replace(problem, seqlen_k=3000))
    for _ in range(3):
        autotune.attention(q, k, v, causal=True)
    assert _backend_run(q, k, v, True) == "default"
    for step in range(3):
        grown = replace(CUDNN_WINS, seqlen_k=CUDNN_WINS.seqlen_k + step)
        q, k, v = make(grown)
        out = autotune.attention(q, k, v, causal=False)
        assert _backend_run(q, k, v, False) == "cudnn"
        check(out, q, k, v, grown, "bhld", fp16_tol=2e-3, bf16_tol=1e-2)
    q, k, v = make(PREFILL)
    routed, names = _kernels(autotune.attention, q, k, v, causal=True)
    direct, torch_names = _kernels(
        torch.nn.functional.scaled_dot_product_attention, q, k, v, is_causal=True
    )
    assert names == torch_names
    torch.testing.assert_close(routed, direct, rtol=0, atol=0)
