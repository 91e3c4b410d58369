"""Two GPUs of one host (issue 18): `attention` and `attention_with_kvcache` with their tensors
on the second GPU (cuda:1) while the current device is the first; alternating devices call by
call; a thread per GPU calling concurrently; a CUDA graph captured on cuda:1. Every output is
checked against the fp32 reference. Each kernel must run on its tensors' own device (the
profiler's record of it) and on the caller's current stream there (its inputs are written on
that stream behind a long sleep, so a launch anywhere else would read the poisoned inputs).
Runs whenever two sm_90 GPUs are visible; skipped otherwise.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator

import pytest
import torch

import autotune
from autotune.measure.kvcache_inputs import KVCase, make_kv_inputs
from autotune.measure.reference import reference_attention
from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.model.status import Status
from autotune.runtime.attention import configure
from autotune.runtime.dispatch import device_info
from autotune.store.records import TrialResult
from autotune.store.repo import TuningStore

from .test_decode_gpu import _check


def _two_hoppers() -> bool:
    return (
        torch.cuda.is_available()
        and torch.cuda.device_count() >= 2
        and all(torch.cuda.get_device_capability(i) == (9, 0) for i in range(2))
    )


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _two_hoppers(), reason="needs two sm_90 GPUs"),
]

# A tuned sm90 prefill config (the exact path), as in test_sm90_dispatch_gpu.
PROBLEM = Problem(2, 16, 4, 1100, 1300, 128, "fp16", True)
TILE = dict(
    block_m=128,
    block_n=128,
    consumer_wgs=2,
    kv_stages=2,
    producer_regs=24,
    overlap=True,
    pingpong=True,
    persistent=True,
)
# KV caches: the decode family (per-sequence lengths) and decode90 (a full cache, its splits
# reduced in a thread-block cluster).
DECODE = Config.make(
    "decode",
    {
        "head_dim": 128,
        "dtype": "bf16",
        "causal": True,
        "block_m": 16,
        "block_n": 64,
        "num_warps": 4,
        "kv_stages": 3,
        "pack_gqa": True,
        "num_splits": 4,
    },
)
DECODE90 = Config.make(
    "decode90",
    {
        "head_dim": 128,
        "dtype": "bf16",
        "causal": True,
        "block_m": 64,
        "block_n": 128,
        "consumer_wgs": 1,
        "kv_stages": 3,
        "overlap": False,
        "num_splits": 4,
    },
)
SLEEP_CYCLES = 50_000_000  # ~25 ms at the H200's clock: far longer than a launch takes


@pytest.fixture(scope="module", autouse=True)
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    db = f"sqlite:///{tmp_path_factory.mktemp('db')}/two.db"
    config = load_space("sm90").config(**PROBLEM.space_values(), **TILE)
    for index in (0, 1):  # the same GPU model: one entry serves both, stored per device anyway
        TuningStore(db).set_best(
            device_info(index),
            PROBLEM,
            TrialResult(config, Status.OK, median_us=100.0),
            measurement_id=None,
            study="test",
            trials=1,
            sdpa_default_us=110.0,
            sdpa_flash_us=200.0,
        )
    configure(db=db, use_shipped=False)
    yield
    configure()


def _inputs(device: str, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    p = PROBLEM

    def tensor(heads: int, length: int) -> torch.Tensor:
        return torch.randn(p.batch, heads, length, p.head_dim, generator=gen).to(
            device=device, dtype=torch.float16
        )

    return (
        tensor(p.heads_q, p.seqlen_q),
        tensor(p.heads_kv, p.seqlen_k),
        tensor(p.heads_kv, p.seqlen_k),
    )


def _assert_matches(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    assert out.device == q.device
    ref, _ = reference_attention(q, k, v, causal=True, scale=1 / math.sqrt(128))
    assert bool(torch.isfinite(out).all())
    err = torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref)
    assert float(err) < 1e-3, float(err)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = autotune.attention(q, k, v, causal=True, strict=True)
    return out


def test_the_second_gpus_tensors_run_there_from_the_first() -> None:
    with torch.cuda.device(0):
        q, k, v = _inputs("cuda:1", 1)
        decision = autotune.explain(q, k, v, causal=True)
        assert decision.config is not None and decision.config.family == "sm90", (
            decision.describe()
        )
        for _ in range(2):  # the second call takes the prepared fast path
            _assert_matches(_attention(q, k, v), q, k, v)


def test_each_kernel_runs_on_its_tensors_device() -> None:
    """The profiler names the device of every kernel it saw: ours ran once on each GPU."""
    pairs = [_inputs(f"cuda:{i}", 10 + i) for i in (0, 1)]
    for q, k, v in pairs:
        _attention(q, k, v)  # loaded and planned outside the profile
    with (
        torch.cuda.device(0),
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof,
    ):
        for q, k, v in reversed(pairs):
            _attention(q, k, v)
        for i in (0, 1):
            torch.cuda.synchronize(i)
    ran = sorted(e.device_index for e in prof.events() if e.name == "cute_autotune_fwd")
    assert ran == [0, 1], [(e.name, e.device_index) for e in prof.events()]


def test_the_callers_stream_on_the_second_gpu() -> None:
    """q is written on the caller's stream of cuda:1 behind a sleep: a kernel launched on any
    other stream (or device) would read the NaN it was poisoned with."""
    good, k, v = _inputs("cuda:1", 2)
    q = torch.full_like(good, float("nan"))
    _attention(good, k, v)  # decided and loaded before the timed part
    stream = torch.cuda.Stream(device="cuda:1")
    stream.wait_stream(torch.cuda.current_stream("cuda:1"))
    with torch.cuda.device(0):
        with torch.cuda.stream(stream):
            torch.cuda._sleep(SLEEP_CYCLES)
            q.copy_(good)
            out = _attention(q, k, v)
        assert not stream.query(), "the call waited for the caller's stream (it synchronised)"
    stream.synchronize()
    _assert_matches(out, good, k, v)


def test_devices_alternating_call_by_call() -> None:
    inputs = [_inputs(f"cuda:{i}", 20 + i) for i in (0, 1)]
    outs = [_attention(*inputs[n % 2]) for n in range(8)]
    for n, out in enumerate(outs):
        _assert_matches(out, *inputs[n % 2])


def test_a_thread_per_gpu_calling_concurrently() -> None:
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def calls(index: int) -> None:
        try:
            q, k, v = _inputs(f"cuda:{index}", 30 + index)
            with torch.cuda.device(index), torch.cuda.stream(torch.cuda.Stream()):
                start.wait()
                outs = [_attention(q, k, v) for _ in range(10)]
                torch.cuda.current_stream().synchronize()
            for out in outs:
                _assert_matches(out, q, k, v)
        except BaseException as exc:  # re-raised in the test's thread below
            errors.append(exc)

    threads = [threading.Thread(target=calls, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_cuda_graph_captured_on_the_second_gpu() -> None:
    with torch.cuda.device(1):
        q, k, v = _inputs("cuda:1", 3)
        _attention(q, k, v)  # decide and load outside the capture
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            captured = _attention(q, k, v)
        torch.cuda.current_stream().wait_stream(stream)
        for seed in (4, 5):  # new inputs in place, then replay
            fresh = _inputs("cuda:1", seed)
            for t, new in zip((q, k, v), fresh, strict=True):
                t.copy_(new)
            graph.replay()
            torch.cuda.synchronize(1)
            _assert_matches(captured, q, k, v)


@pytest.mark.parametrize("config", [DECODE, DECODE90], ids=lambda c: c.family)
def test_kv_caches_on_the_second_gpu(config: Config) -> None:
    lengths = (1000, 333) if config.family == "decode" else None  # decode90: full caches
    case = KVCase.make(
        batch=2,
        heads_q=16,
        heads_kv=2,
        seqlen_q=4,
        capacity=1000,
        lengths=lengths,
        head_dim=128,
        dtype="bf16",
        causal=True,
    )
    per_device = [make_kv_inputs(case, f"cuda:{i}", 40 + i) for i in (0, 1)]
    with torch.cuda.device(0):
        for n in range(4):  # alternating devices, cuda:1 first
            x = per_device[(n + 1) % 2]
            out, lse = autotune.attention_with_kvcache(
                x.q,
                x.k_cache,
                x.v_cache,
                cache_seqlens=x.cache_seqlens,
                causal=True,
                return_lse=True,
                config=config,
            )
            assert out.device == x.q.device
            _check(out, lse, x, case, x.cache_seqlens)
