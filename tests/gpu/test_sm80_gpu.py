"""sm80 family on a real GPU: other head dims against the fp32 reference, and the launcher's
promises (caller's stream, no device synchronisation, CUDA-graph capture, input errors).

Every valid config of its sub-spaces is in tests/gpu/test_every_valid_config.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pytest

from autotune.build.compiler import compile_config
from autotune.launch.kernel import CompiledKernel
from autotune.launch.tensors import InputError
from autotune.measure.protocol import ValidateRequest
from autotune.measure.reference import reference_attention
from autotune.measure.validate import ValidationReport
from autotune.measure.worker import GpuWorker
from autotune.model.space import load_space
from autotune.model.target import default_target

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def worker() -> Iterator[GpuWorker]:
    import torch

    with GpuWorker(torch.cuda.current_device()) as w:
        yield w


@pytest.mark.parametrize("head_dim", [32, 96, 256])
def test_other_head_dims_validate(worker: GpuWorker, head_dim: int) -> None:
    target = default_target()
    space = load_space("sm80")
    for dtype, causal in (("fp16", True), ("bf16", False)):
        config = space.valid_configs(
            target, {"head_dim": head_dim, "dtype": dtype, "causal": causal, "kv_stages": 2}
        )[0]
        build = compile_config(config, target)
        assert build.ok, build.message
        reply = worker.request(ValidateRequest(build))
        assert isinstance(reply, ValidationReport) and reply.passed, reply


@pytest.fixture(scope="module")
def kernel() -> CompiledKernel:
    config = load_space("sm80").config(
        head_dim=64,
        dtype="fp16",
        causal=True,
        block_m=128,
        block_n=64,
        num_warps=4,
        kv_stages=2,
        swizzle=3,
        q_in_regs=False,
    )
    build = compile_config(config)
    assert build.ok, build.message
    return CompiledKernel(build)


def inputs(lq: int = 300, lk: int = 400, hq: int = 4, hkv: int = 2, d: int = 64):
    import torch

    q = torch.randn(2, hq, lq, d, device="cuda", dtype=torch.float16)
    k = torch.randn(2, hkv, lk, d, device="cuda", dtype=torch.float16)
    v = torch.randn(2, hkv, lk, d, device="cuda", dtype=torch.float16)
    return q, k, v


def assert_matches_reference(out, q, k, v) -> None:  # type: ignore[no-untyped-def]
    import torch

    ref, _ = reference_attention(q, k, v, causal=True, scale=1 / math.sqrt(q.shape[-1]))
    err = torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref)
    assert float(err) < 1e-3


def test_runs_on_the_callers_stream_without_synchronising(kernel: CompiledKernel) -> None:
    import torch

    q, k, v = inputs()
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU time queued ahead of the kernel
        start = time.perf_counter()
        out, _ = kernel(q, k, v)
        host_s = time.perf_counter() - start
    assert host_s < 0.1, f"the call blocked the host for {host_s:.3f} s"
    assert not side.query(), "the kernel did not queue behind the side stream's work"
    side.synchronize()
    assert_matches_reference(out, q, k, v)


def test_cuda_graph_capture_and_replay(kernel: CompiledKernel) -> None:
    import torch

    q, k, v = inputs()
    out = torch.empty_like(q)
    kernel(q, k, v, out=out)  # warm-up outside the capture (module already loaded)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(q, k, v, out=out)
    for _ in range(2):
        q.copy_(torch.randn_like(q))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches_reference(out, q, k, v)


def test_input_errors_are_clear(kernel: CompiledKernel) -> None:
    import torch

    q, k, v = inputs()
    with pytest.raises(InputError, match="dtype"):
        kernel(q.float(), k.float(), v.float())
    with pytest.raises(InputError, match="multiple of key/value heads"):
        kernel(q[:, :3], k, v)
    with pytest.raises(InputError, match="does not match kernel"):
        kernel(*inputs(d=128))
    with pytest.raises(InputError, match="head dimension must be contiguous"):
        kernel(q.transpose(2, 3).contiguous().transpose(2, 3), k, v)
    padded = torch.randn(2, 4, 300, 68, device="cuda", dtype=torch.float16)[..., :64]
    with pytest.raises(InputError, match="row stride 68"):
        kernel(padded, k, v)
    with pytest.raises(InputError, match="scale"):
        kernel(q, k, v, scale=-1.0)
    with pytest.raises(InputError, match="lse must be"):
        kernel(q, k, v, lse=torch.empty(2, 4, 299, device="cuda"))
