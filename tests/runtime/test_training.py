"""Attention that autograd differentiates, on the CPU: which backward serves a problem
(`backward_config`), and the plumbing of the custom ops (the forward keeps its LSE, the
registered backward hands q, k, v, out, the upstream gradient and the LSE to the backward
kernel, and its gradients reach the leaves), in eager mode and traced by torch.compile. The
backward kernel is replaced by the fp32 reference of the gradients; the kernel itself is
checked on the GPU (tests/gpu/test_backward_gpu.py)."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from autotune.launch.tensors import logical_bhld
from autotune.measure.reference_backward import reference_gradients
from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.model.target import target_for_arch
from autotune.runtime import attention as attention_module
from autotune.runtime import training
from autotune.runtime.attention import configure
from autotune.store.records import DeviceInfo, TrialResult
from autotune.store.repo import TuningStore


@pytest.fixture
def dispatcher_of(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(
        "autotune.model.target.target_for_device", lambda index=None: target_for_arch("sm_90")
    )
    monkeypatch.setattr("autotune.runtime.dispatch.target_for_device", lambda index=None: SM90)
    monkeypatch.setattr("autotune.runtime.dispatch.device_info", lambda index: H200)

    def make(untuned: str) -> Any:
        return configure(db=f"sqlite:///{tmp_path}/t.db", use_shipped=False, untuned=untuned)

    yield make
    configure()


def problem(head_dim: int = 128, dtype: str = "bf16", causal: bool = True) -> Problem:
    return Problem(2, 8, 2, 300, 333, head_dim, dtype, causal)


H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
SM90 = target_for_arch("sm_90")


def tuned(db: str, grad: Problem, winner: Config, us: float, sdpa_us: float) -> None:
    """A backward problem's re-ranking as a tuning session stores it: the winner, with
    torch's backward beside it."""
    store = TuningStore(db)
    result = TrialResult(winner, "ok", median_us=us, p20_us=us, p80_us=us, rounds=9)
    mid = store.record_trial(
        H200, grad, result, build=None, study="s", phase="rerank", baseline_us=sdpa_us
    )
    store.set_best(
        H200,
        grad,
        result,
        measurement_id=mid,
        study="s",
        trials=4,
        sdpa_default_us=sdpa_us,
        sdpa_flash_us=None,
    )


def bwd_config(deterministic: bool = False, **tile: object) -> Config:
    space = load_space("bwd")
    values = {"head_dim": 128, "dtype": "bf16", "causal": True, "deterministic": deterministic}
    default = space.heuristic(values)
    assert default is not None
    config = space.validate(default.replace(**tile))  # type: ignore[arg-type]
    assert not space.violations(config, SM90)
    return config


@pytest.mark.parametrize("untuned", ["measured", "kernel"])
def test_a_tuned_backward_problem_runs_its_winner(
    dispatcher_of: Any, tmp_path: Any, untuned: str
) -> None:
    """The winner of the problem's backward re-ranking runs it, and its neighbours of the same
    class (another batch, another length); where torch's backward won, torch runs it, whatever
    the dispatcher runs untuned; the deterministic mode reads its own rows."""
    db = f"sqlite:///{tmp_path}/t.db"
    grad = replace(problem(), backward=True)
    winner = bwd_config(block_m=32, stages=1, dq_warps_m=1)
    tuned(db, grad, winner, 500.0, 600.0)
    dispatcher_of(untuned)
    assert training.backward_config(problem(), 0) == winner.to_json()
    assert training.backward_config(replace(problem(), batch=4, seqlen_q=700), 0) == (
        winner.to_json()
    )
    # the deterministic mode: no row of its own, so torch's (or the default, untuned)
    deterministic = training.backward_config(problem(), 0, deterministic=True)
    if untuned == "measured":
        assert deterministic is None
    else:
        assert deterministic is not None and json.loads(deterministic)["deterministic"] is True
    # torch's backward won another problem of the class: torch runs it
    other = Problem(1, 8, 2, 4096, 4096, 128, "bf16", True)
    sdpa = load_space("sdpa").config(**other.space_values(), backend="default")
    tuned(db, replace(other, backward=True), sdpa, 700.0, 700.0)
    dispatcher_of(untuned)
    assert training.backward_config(other, 0) is None
    assert training.backward_config(problem(), 0) == winner.to_json()


def test_a_winner_of_the_other_mode_is_never_run(dispatcher_of: Any, tmp_path: Any) -> None:
    """A row that names a non-deterministic config as the deterministic mode's winner (a
    database edited by hand) is not run where bit-identical gradients were asked for."""
    db = f"sqlite:///{tmp_path}/t.db"
    grad = replace(problem(), backward=True, deterministic=True)
    tuned(db, grad, bwd_config(deterministic=True), 500.0, 600.0)
    dispatcher_of("measured")
    chosen = training.backward_config(problem(), 0, deterministic=True)
    assert chosen is not None and json.loads(chosen)["deterministic"] is True
    assert training.backward_config(problem(), 0) is None  # the other mode: untuned


def test_untuned_kernel_runs_the_family_default(dispatcher_of: Any) -> None:
    dispatcher_of("kernel")
    chosen = training.backward_config(problem(), 0)
    assert chosen is not None
    config = json.loads(chosen)
    assert config["family"] == "bwd" and config["head_dim"] == 128 and config["causal"] is True


def test_torchs_deterministic_setting_picks_a_deterministic_backward(dispatcher_of: Any) -> None:
    dispatcher_of("kernel")
    assert json.loads(training.backward_config(problem(), 0) or "{}")["deterministic"] is False
    torch.use_deterministic_algorithms(True)
    try:
        chosen = training.backward_config(problem(), 0)
    finally:
        torch.use_deterministic_algorithms(False)
    assert chosen is not None and json.loads(chosen)["deterministic"] is True


def test_deterministic_true_picks_a_deterministic_backward(dispatcher_of: Any) -> None:
    dispatcher_of("kernel")
    chosen = training.backward_config(problem(), 0, deterministic=True)
    assert chosen is not None and json.loads(chosen)["deterministic"] is True


def test_measured_dispatch_keeps_torchs_backward(dispatcher_of: Any) -> None:
    dispatcher_of("measured")
    assert training.backward_config(problem(), 0) is None


def test_a_head_dim_the_family_lacks_keeps_torchs_backward(dispatcher_of: Any) -> None:
    dispatcher_of("kernel")
    assert training.backward_config(problem(head_dim=32), 0) is None
    assert training.backward_config(problem(head_dim=80), 0) is None
    assert training.backward_config(problem(head_dim=256), 0) is not None


def test_the_choice_follows_configure(dispatcher_of: Any) -> None:
    dispatcher_of("kernel")
    assert training.backward_config(problem(), 0) is not None
    dispatcher_of("measured")  # a new dispatcher: its own decisions
    assert training.backward_config(problem(), 0) is None


def test_inputs_that_require_grad_are_served_only_where_a_backward_runs(
    dispatcher_of: Any,
) -> None:
    from autotune.runtime.attention import _backward_serves

    dispatcher_of("kernel")
    assert _backward_serves(problem(), 0)
    with torch.no_grad():  # no graph is recorded: nothing to differentiate
        assert not _backward_serves(problem(), 0)
    dispatcher_of("measured")
    assert not _backward_serves(problem(), 0)


def test_attention_with_kvcache_refuses_inputs_that_require_grad() -> None:
    import autotune

    q = torch.randn(1, 1, 2, 64, requires_grad=True)
    cache = torch.randn(1, 16, 2, 64)
    with pytest.raises(ValueError, match=r"forward-only.*autotune.attention\(\)"):
        autotune.attention_with_kvcache(q, cache, cache.clone())
    with torch.no_grad():  # allowed: nothing to differentiate (here: a CPU fallback)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                autotune.attention_with_kvcache(q, cache, cache.clone())
            except ValueError as exc:
                assert "forward-only" not in str(exc)


class ReferenceBackward:
    """Stands for a loaded backward kernel: the fp32 reference gradients, in the dtype and
    layout of q, k and v, and a record of what it was handed."""

    def __init__(self, causal: bool) -> None:
        self.causal = causal
        self.calls: list[dict[str, Any]] = []

    def __call__(self, q: Any, k: Any, v: Any, out: Any, dout: Any, lse: Any, **kw: Any) -> Any:
        self.calls.append({"out": out, "dout": dout, "lse": lse, **kw})
        grads = reference_gradients(
            q, k, v, dout, causal=self.causal, scale=kw["scale"], layout=kw["layout"]
        )
        result = []
        for like, grad in zip((q, k, v), grads, strict=True):
            t = torch.empty_like(like)
            logical_bhld(t, kw["layout"]).copy_(grad)
            result.append(t)
        return tuple(result)


@pytest.fixture
def reference_kernel(monkeypatch: pytest.MonkeyPatch) -> ReferenceBackward:
    kernel = ReferenceBackward(causal=True)
    monkeypatch.setattr(training, "_compiled", lambda config, device: kernel)
    return kernel


def leaves(layout: str, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    b, hq, hkv, lq, lk, d = 2, 4, 2, 37, 53, 64
    shapes = [(b, hq, lq, d), (b, hkv, lk, d), (b, hkv, lk, d)]
    if layout == "blhd":
        shapes = [(s[0], s[2], s[1], s[3]) for s in shapes]
    return [torch.randn(s, generator=g, dtype=dtype).requires_grad_() for s in shapes]


def torch_gradients(ts: list[torch.Tensor], layout: str, dout: torch.Tensor) -> list[Any]:
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = (logical_bhld(t.detach(), layout).double().requires_grad_() for t in ts)
    mask = causal_lower_right(q.shape[2], k.shape[2])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    out.backward(logical_bhld(dout, layout).double())
    return [t.grad for t in (q, k, v)]


@pytest.mark.parametrize("layout", ["bhld", "blhd"])
def test_gradients_reach_the_leaves_through_the_registered_backward(
    reference_kernel: ReferenceBackward, layout: str
) -> None:
    ts = leaves(layout)
    out = training.differentiable_attention(
        *ts, causal=True, scale=None, layout=layout, backward='{"family":"bwd"}'
    )
    dout = torch.randn_like(out)
    out.backward(dout)
    expected = torch_gradients(ts, layout, dout)
    for t, want in zip(ts, expected, strict=True):
        assert t.grad is not None and t.grad.shape == t.shape
        torch.testing.assert_close(
            logical_bhld(t.grad, layout).double(), want, atol=1e-4, rtol=1e-4
        )
    (call,) = reference_kernel.calls
    assert call["scale"] == pytest.approx(64**-0.5) and call["layout"] == layout
    assert call["lse"].dtype == torch.float32 and call["lse"].is_contiguous()
    assert call["lse"].shape == (2, 4, 37)


def test_an_expanded_upstream_gradient_is_made_a_kernel_operand(
    reference_kernel: ReferenceBackward,
) -> None:
    ts = leaves("bhld")
    out = training.differentiable_attention(
        *ts, causal=True, scale=0.3, layout="bhld", backward='{"family":"bwd"}'
    )
    out.sum().backward()  # the upstream gradient: ones expanded with stride 0
    (call,) = reference_kernel.calls
    assert call["dout"].stride()[-1] == 1 and min(call["dout"].stride()) > 0
    assert call["scale"] == pytest.approx(0.3)


def test_torch_compile_traces_forward_and_backward(reference_kernel: ReferenceBackward) -> None:
    ts = leaves("bhld")

    def step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = training.differentiable_attention(
            q, k, v, causal=True, scale=None, layout="bhld", backward='{"family":"bwd"}'
        )
        return (out * out).sum()

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    compiled(*ts).backward()
    got = [t.grad.clone() for t in ts]
    for t in ts:
        t.grad = None
    step(*ts).backward()
    for a, b in zip(got, [t.grad for t in ts], strict=True):
        torch.testing.assert_close(a, b)
    assert len(reference_kernel.calls) == 2


def test_cpu_inputs_that_require_grad_stay_on_torch(dispatcher_of: Any) -> None:
    """attention() on the CPU: torch differentiates its own fallback, as before."""
    dispatcher_of("kernel")
    ts = leaves("bhld")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning (once per process)
        out = attention_module.attention(*ts, causal=True)
    out.sum().backward()
    assert all(t.grad is not None for t in ts)
