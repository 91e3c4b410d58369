"""Dispatch to a torch SDPA winner on the GPU: a problem whose stored best is an `sdpa` config
runs that backend (eager, the custom op under torch.compile, a captured CUDA graph), with the
log-sum-exp from a torch op that returns it, checked against the fp32 reference; and the
no-regret rule sends an untuned decode shape to SDPA when no kernel was measured faster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import autotune
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.runtime.attention import configure
from autotune.runtime.dispatch import device_info
from autotune.store.records import TrialResult
from autotune.store.repo import TuningStore

from .attention_inputs import check as check_output
from .attention_inputs import make

pytestmark = pytest.mark.gpu

WINNERS = {  # problem -> the SDPA backend stored as its best
    Problem(2, 8, 8, 256, 256, 128, "bf16", False): "default",
    Problem(2, 8, 2, 200, 333, 64, "fp16", True): "flash",  # GQA, causal, Lq != Lk
    Problem(1, 8, 2, 130, 130, 128, "fp16", True): "efficient",  # GQA: K/V expanded for LSE
    Problem(2, 8, 8, 512, 512, 128, "bf16", True): "cudnn",
}


@pytest.fixture(scope="module", autouse=True)
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = f"sqlite:///{tmp_path_factory.mktemp('db')}/sdpa.db"
    store = TuningStore(db)
    for problem, backend in WINNERS.items():
        config = load_space("sdpa").config(**problem.space_values(), backend=backend)
        store.set_best(
            device_info(0),
            problem,
            TrialResult(config, "ok", median_us=40.0),
            measurement_id=None,
            study="test",
            trials=1,
            sdpa_default_us=41.0,
            sdpa_flash_us=60.0,
            decision="tie with a kernel: torch SDPA preferred",
        )
    configure(db=db, use_shipped=False)
    yield db
    configure()


def inputs(problem: Problem, layout: str = "bhld") -> tuple[torch.Tensor, ...]:
    return make(problem, layout)


def check(
    out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    layout: str,
    lse: torch.Tensor | None = None,
) -> None:
    check_output(out, q, k, v, problem, layout, lse, fp16_tol=2e-3, bf16_tol=1e-2)


@pytest.mark.parametrize("layout", ["bhld", "blhd"])
@pytest.mark.parametrize("problem", list(WINNERS), ids=list(WINNERS.values()))
def test_eager_runs_the_stored_backend_with_its_lse(problem: Problem, layout: str) -> None:
    q, k, v = inputs(problem, layout)
    decision = autotune.explain(q, k, v, causal=problem.causal, layout=layout)
    assert decision.path == "exact" and decision.sdpa_backend == WINNERS[problem]
    assert "torch SDPA" in decision.describe() and "SDPA preferred" in decision.describe()
    out = autotune.attention(q, k, v, causal=problem.causal, layout=layout, strict=True)
    check(out, q, k, v, problem, layout)
    out, lse = autotune.attention(
        q, k, v, causal=problem.causal, layout=layout, return_lse=True, strict=True
    )
    check(out, q, k, v, problem, layout, lse)


def test_lse_comes_from_a_torch_op_not_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.measure.reference as reference

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the fp32 reference ran on the hot path")

    problem = next(p for p, b in WINNERS.items() if b == "flash")
    q, k, v = inputs(problem)
    monkeypatch.setattr(reference, "reference_attention", refuse)
    out, lse = autotune.attention(q, k, v, causal=True, return_lse=True, strict=True)
    monkeypatch.undo()
    check(out, q, k, v, problem, "bhld", lse)


def test_torch_compile_and_cuda_graph_with_an_sdpa_winner() -> None:
    problem = next(p for p, b in WINNERS.items() if b == "cudnn")
    q, k, v = inputs(problem)

    def block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return autotune.attention(q * 1.0, k, v, causal=True, strict=True) + 0.0

    compiled = torch.compile(block, fullgraph=True)
    check(compiled(q, k, v), q, k, v, problem, "bhld")
    autotune.attention(q, k, v, causal=True, strict=True)  # decide outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = autotune.attention(q, k, v, causal=True, strict=True)
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        graph.replay()
        torch.cuda.synchronize()
        check(out, q, k, v, problem, "bhld")


def test_untuned_decode_goes_to_sdpa_without_a_warning() -> None:
    problem = Problem(4, 32, 8, 1, 4096, 64, "fp16", False)  # no tuned problem of its class
    q, k, v = inputs(problem)
    decision = autotune.explain(q, k, v)
    assert decision.path == "heuristic" and decision.sdpa_backend == "default", decision.describe()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = autotune.attention(q, k, v, strict=True)
    check(out, q, k, v, problem, "bhld")


def test_misses_are_counted_without_a_database_touch_per_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune.model.buckets import representative
    from autotune.runtime import attention as runtime
    from autotune.store.repo import TuningStore as Store

    problem = Problem(2, 8, 2, 1, 2048, 64, "bf16", False)  # untuned: SDPA by the rule
    q, k, v = inputs(problem)
    writes: list[int] = []
    original = Store.add_misses

    def counted(self: Store, entries: object) -> int:
        writes.append(1)
        return original(self, entries)  # type: ignore[arg-type]

    monkeypatch.setattr(Store, "add_misses", counted)
    dispatcher = runtime.dispatcher()
    runtime.recorder().flush()  # what earlier tests served
    writes.clear()
    before = dispatcher.db_queries
    for _ in range(200):
        autotune.attention(q, k, v)
    assert dispatcher.db_queries == before + 1  # the decision, once
    assert len(writes) <= 1  # at most the periodic flush, never a write per call
    runtime.recorder().flush()
    # counted for the problem's length class, under its representative (what tuning would
    # cover the class with: model/buckets.py)
    misses = [m for m in dispatcher.store().list_misses() if m.problem == representative(problem)]
    assert [(m.path, m.count) for m in misses] == [("heuristic:sdpa", 200)]
