"""The bwd family on a real GPU: its gradients through the gradient validator (every case of
the forward validator: tails, Lq != Lk both ways, GQA and MQA, both layouts, a packed-QKV
view, adversarial scores; NaN-poisoned outputs, two runs), for each head dim's default config
and a covering sample of the space; and the launcher's promises (the caller's stream, no
synchronisation, CUDA-graph capture).

The forward under test is the fp32 reference's (its output rounded to the input dtype and its
LSE), so a failure here is the backward's.
"""

from __future__ import annotations

from typing import Any

import pytest

from autotune.build.compiler import compile_many
from autotune.launch.backward import CompiledBackward
from autotune.launch.tensors import logical_bhld
from autotune.measure.reference import reference_attention
from autotune.measure.validate_backward import kernel_runner, validate_backward
from autotune.model.config import Config
from autotune.model.sampling import covering_sample
from autotune.model.space import default_config, load_space
from autotune.model.target import default_target

pytestmark = pytest.mark.gpu


def built(configs: list[Config]) -> list[CompiledBackward]:
    results = compile_many(configs, default_target())
    for result in results:
        assert result.ok, f"{result.config}: {result.message}"
    return [CompiledBackward(result) for result in results]


DEFAULTS = [
    (d, dtype, causal)
    for d in (64, 96, 128, 256)
    for dtype in ("fp16", "bf16")
    for causal in (False, True)
]
SAMPLED = [(128, "bf16", True), (64, "fp16", False)]


def sample(head_dim: int, dtype: str, causal: bool) -> list[Config]:
    """A covering sample: every tunable value in some config."""
    configs = load_space("bwd").valid_configs(
        default_target(), {"head_dim": head_dim, "dtype": dtype, "causal": causal}
    )
    return list(covering_sample(configs, 0.15, seed=3))


@pytest.fixture(scope="module", autouse=True)
def prebuilt() -> None:
    """The defaults the module's tests run, compiled at once on all cores (the tests then hit
    the cache; the covering sample compiles its own, also at once)."""
    space = load_space("bwd")
    configs: list[Config] = []
    for head_dim, dtype, causal in DEFAULTS:
        config = space.heuristic({"head_dim": head_dim, "dtype": dtype, "causal": causal})
        assert config is not None
        configs.append(config)
    configs += deterministic_defaults()
    results = compile_many(configs + [forward_default()], default_target())
    for result in results:
        assert result.ok, f"{result.config}: {result.message}"


def forward_default() -> Config:
    """The forward config the autograd test's problem runs (the kernels' own default)."""
    config = default_config({"head_dim": 128, "dtype": "bf16", "causal": True}, default_target())
    assert config is not None
    return config


def deterministic_defaults() -> list[Config]:
    space = load_space("bwd")
    configs = []
    for head_dim, dtype, causal in ((128, "bf16", True), (64, "fp16", False)):
        config = space.heuristic(
            {"head_dim": head_dim, "dtype": dtype, "causal": causal, "deterministic": True}
        )
        assert config is not None
        configs.append(config)
    return configs


def test_deterministic_mode_gives_bit_identical_gradients() -> None:
    """The validator's deterministic mode: its two runs must be bit-identical, dQ included."""
    for kernel in built(deterministic_defaults()):
        config = kernel.config
        report = validate_backward(
            kernel_runner(kernel),
            head_dim=int(config["head_dim"]),
            dtype=str(config["dtype"]),
            causal=bool(config["causal"]),
            seed=21,
            deterministic=True,
        )
        print(f"{load_space('bwd').name_of(config)}: {report.summary()}")
        assert report.passed, report.summary()


@pytest.mark.parametrize(("head_dim", "dtype", "causal"), DEFAULTS)
def test_default_config_passes_the_gradient_validator(
    head_dim: int, dtype: str, causal: bool
) -> None:
    space = load_space("bwd")
    config = space.heuristic({"head_dim": head_dim, "dtype": dtype, "causal": causal})
    assert config is not None
    (kernel,) = built([config])
    report = validate_backward(
        kernel_runner(kernel), head_dim=head_dim, dtype=dtype, causal=causal, seed=5, device="cuda"
    )
    print(f"{space.name_of(config)}: {report.summary()}")
    assert report.passed, report.summary()


def test_a_covering_sample_of_the_space_passes() -> None:
    """Every tunable value in some config: stages 1 and 2, each swizzle, each dQ warp split,
    each tile shape the registers allow, at D=128 bf16 causal and D=64 fp16 full."""
    space = load_space("bwd")
    failures = []
    for head_dim, dtype, causal in SAMPLED:
        for kernel in built(sample(head_dim, dtype, causal)):
            report = validate_backward(
                kernel_runner(kernel), head_dim=head_dim, dtype=dtype, causal=causal, seed=9
            )
            print(f"{space.name_of(kernel.config)}: {report.summary()}")
            if not report.passed:
                failures.append(f"{space.name_of(kernel.config)}: {report.summary()}")
    assert not failures, "\n".join(failures)


def test_runs_on_the_callers_stream_without_sync_and_in_a_graph() -> None:
    import torch

    space = load_space("bwd")
    (kernel,) = built([space.heuristic({"head_dim": 128, "dtype": "bf16", "causal": True})])
    g = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(2, 8, 300, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(2, 2, 333, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn_like(k)
    dout = torch.randn_like(q)
    out32, lse = reference_attention(q, k, v, causal=True, scale=128**-0.5)
    out = out32.to(torch.bfloat16)
    lse = lse.contiguous()
    expected = kernel(q, k, v, out, dout, lse)
    torch.cuda.synchronize()

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = kernel(q, k, v, out, dout, lse)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    stream.synchronize()
    for a, b in zip(expected, got, strict=True):
        # dQ is summed by atomics in any order: its last bits may differ
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)

    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kernel(q, k, v, out, dout, lse)  # warm-up outside the capture
        with torch.cuda.graph(graph):
            captured = kernel(q, k, v, out, dout, lse)
    torch.cuda.current_stream().wait_stream(side)
    for t in captured:
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(expected, captured, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("layout", ["bhld", "blhd"])
def test_attention_differentiates_with_the_backward_family(layout: str, tmp_path: Any) -> None:
    """attention() with inputs that require grad, untuned="kernel": the kernels' forward and
    the family's backward (its kernel is what runs), gradients against fp32 autograd."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.bias import causal_lower_right

    import autotune
    from autotune.runtime.attention import configure

    configure(db=f"sqlite:///{tmp_path}/empty.db", use_shipped=False, untuned="kernel")
    try:
        g = torch.Generator(device="cuda").manual_seed(2)
        b, hq, hkv, lq, lk, d = 2, 8, 2, 257, 300, 128

        def make(h: int, length: int) -> torch.Tensor:
            shape = (b, h, length, d) if layout == "bhld" else (b, length, h, d)
            t = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
            return t.requires_grad_()

        q, k, v = make(hq, lq), make(hkv, lk), make(hkv, lk)
        dout = torch.randn_like(q)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out = autotune.attention(q, k, v, causal=True, layout=layout)
            out.backward(dout)
            torch.cuda.synchronize()
        names = {e.name for e in prof.events()}
        assert "cute_autotune_bwd" in names and "cute_autotune_fwd" in names, sorted(names)[:20]

        qd, kd, vd = (
            logical_bhld(t.detach(), layout).double().requires_grad_() for t in (q, k, v)
        )
        ref = F.scaled_dot_product_attention(
            qd, kd, vd, attn_mask=causal_lower_right(lq, lk), enable_gqa=True
        )
        ref.backward(logical_bhld(dout, layout).double())
        for got, want in zip((q.grad, k.grad, v.grad), (qd.grad, kd.grad, vd.grad), strict=True):
            assert got is not None
            err = (logical_bhld(got, layout).double() - want).abs().max().item()
            assert err <= 0.03 * max(1.0, want.abs().max().item()), err
    finally:
        configure()
