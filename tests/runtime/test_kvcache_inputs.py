"""attention_with_kvcache without a GPU: the append writes each sequence's new rows where
its length says (contiguous and paged caches alike, device-side indices), and inputs no decode
kernel can take are refused with the argument named."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from autotune.launch.tensors import InputError
from autotune.measure.kvcache_inputs import KVCase, make_kv_inputs
from autotune.runtime.kvcache import _append, _check, attention_with_kvcache


@pytest.mark.parametrize("layout", ["blhd", "bhld"])
@pytest.mark.parametrize("page_size", [0, 8])
def test_append_writes_at_each_sequence_end(layout: str, page_size: int) -> None:
    case = KVCase.make(
        batch=3,
        heads_q=4,
        heads_kv=2,
        seqlen_q=1,
        capacity=32,
        lengths=(2, 20, 32),
        head_dim=16,
        dtype="fp16",
        page_size=page_size,
        layout=layout,
        new=2,
    )
    inputs = make_kv_inputs(case, "cpu", 1)
    assert inputs.cache_seqlens is not None and inputs.k_new is not None
    assert inputs.v_new is not None
    lengths = _append(
        inputs.k_cache,
        inputs.v_cache,
        inputs.k_new,
        inputs.v_new,
        inputs.cache_seqlens,
        inputs.block_table,
        layout,
    )
    assert lengths.dtype == torch.int32 and lengths.tolist() == [2, 20, 32]
    from autotune.measure.reference import gather_kv_cache

    for b, n in enumerate(lengths.tolist()):
        for cache, new in ((inputs.k_cache, inputs.k_new), (inputs.v_cache, inputs.v_new)):
            rows = gather_kv_cache(cache, b, n, block_table=inputs.block_table, layout=layout)
            expect = (new if layout == "bhld" else new.transpose(1, 2))[b]
            assert torch.equal(rows[0, :, n - 2 : n], expect)  # the new rows, at the end
            assert not torch.isnan(rows).any()  # and everything before them was held


def test_bad_inputs_name_the_argument() -> None:
    case = KVCase.make(
        batch=2,
        heads_q=4,
        heads_kv=2,
        seqlen_q=1,
        capacity=16,
        lengths=(3, 4),
        head_dim=16,
        dtype="fp16",
        page_size=8,
    )
    x = make_kv_inputs(case, "cpu", 2)
    cases = {
        "cache_seqlens": dict(cache_seqlens=torch.tensor([3, 4])),  # int64
        "block_table": dict(block_table=x.block_table[:, :1].t().contiguous()),
        "k_new and v_new": dict(k_new=x.q),
        "layout": dict(layout="bshd"),
    }
    for needle, changes in cases.items():
        args = dict(
            k_new=None,
            v_new=None,
            cache_seqlens=x.cache_seqlens,
            block_table=x.block_table,
            layout="blhd",
        )
        args.update(changes)
        with pytest.raises(InputError, match=needle):
            _check(x.q, x.k_cache, x.v_cache, **args)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="power of two"):
        _check(
            x.q,
            x.k_cache[:, :6],
            x.v_cache[:, :6],
            None,
            None,
            x.cache_seqlens,
            x.block_table,
            "blhd",
        )


def test_the_custom_op_gives_shapes_without_running() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    import autotune.runtime.kvcache  # noqa: F401  registers the op

    with FakeTensorMode():
        q = torch.empty(2, 3, 8, 64, dtype=torch.float16)  # blhd
        k = torch.empty(40, 16, 2, 64, dtype=torch.float16)  # pages
        table = torch.empty(2, 5, dtype=torch.int32)
        lengths = torch.empty(2, dtype=torch.int32)
        out, lse = torch.ops.cute_autotune.attention_with_kvcache(
            q, k, k, None, None, lengths, table, True, None, True, "blhd", None, None
        )
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (2, 8, 3) and lse.dtype == torch.float32


def test_the_tuned_decode_config_comes_from_the_database(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """attention_with_kvcache's config for a cache shape: the fastest measured decode config of
    the problem (not a faster config of another family, which cannot read a KV cache), else the
    nearest tuned problem's decode best, else none (the family's default); one database visit
    per problem."""
    from autotune.model.problem import Problem
    from autotune.model.space import load_space
    from autotune.runtime import dispatch as dispatch_module
    from autotune.runtime.dispatch import Dispatcher
    from autotune.store.records import DeviceInfo, TrialResult
    from autotune.store.repo import TuningStore

    h200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
    monkeypatch.setattr(dispatch_module, "shipped_results", lambda: [])
    db = f"sqlite:///{tmp_path}/kv.db"
    store = TuningStore(db)
    problem = Problem(8, 32, 8, 1, 32768, 128, "bf16", False)
    decode = load_space("decode")

    def config(block_n: int, splits: int) -> Any:
        return decode.config(
            **problem.space_values(),
            block_m=16,
            block_n=block_n,
            num_warps=4,
            kv_stages=3,
            pack_gqa=True,
            num_splits=splits,
        )

    sdpa = load_space("sdpa").heuristic(problem.space_values())
    for cfg, us in ((config(64, 2), 260.0), (config(128, 4), 300.0), (sdpa, 250.0)):
        store.record_trial(
            h200,
            problem,
            TrialResult(cfg, "ok", median_us=us),
            build=None,
            study="s",
            phase="rerank",
            baseline_us=250.0,
        )
    store.set_best(
        h200,
        problem,
        TrialResult(sdpa, "ok", median_us=250.0),
        measurement_id=None,
        study="s",
        trials=3,
        sdpa_default_us=250.0,
        sdpa_flash_us=None,
    )
    d = Dispatcher(db)
    d._identify = lambda index: (h200, None)  # type: ignore[method-assign,assignment,return-value]
    found = d.tuned_config(problem, 0, "decode")
    assert found is not None and found[0] == config(64, 2) and "fastest of 2" in found[1]
    queries = d.db_queries
    assert d.tuned_config(problem, 0, "decode") == found and d.db_queries == queries
    # another batch: no measurement of its own, and no best of the decode family nearby yet
    other = Problem(1, 32, 8, 1, 32768, 128, "bf16", False)
    assert d.tuned_config(other, 0, "decode") is None
    # once a neighbour's best is a decode config, it is the answer
    store.set_best(
        h200,
        Problem(2, 32, 8, 1, 32768, 128, "bf16", False),
        TrialResult(config(128, 16), "ok", median_us=90.0),
        measurement_id=None,
        study="s",
        trials=3,
        sdpa_default_us=100.0,
        sdpa_flash_us=None,
    )
    d.clear()
    near = d.tuned_config(other, 0, "decode")
    # the neighbour's config, its split count doubled: half the batch, the same waves of CTAs
    assert near is not None and near[0] == config(128, 32) and "nearest" in near[1]
    assert "its 16 KV splits made 32 for this grid" in near[1]
    # several families (the split-KV ones that read a cache kind): the fastest of any of them
    decode90 = load_space("decode90").config(
        **problem.space_values(),
        block_m=64,
        block_n=128,
        consumer_wgs=1,
        kv_stages=3,
        overlap=True,
        num_splits=2,
    )
    store.record_trial(
        h200,
        problem,
        TrialResult(decode90, "ok", median_us=240.0),
        build=None,
        study="s90",
        phase="rerank",
        baseline_us=250.0,
    )
    d.clear()
    assert d.tuned_config(problem, 0, "decode") == found
    both = d.tuned_config(problem, 0, ("decode", "decode90"))
    assert both is not None and both[0] == decode90 and "decode or decode90" in both[1]
    assert d.tuned_config(other, 0, ("decode90",)) is None  # no decode90 best nearby


def test_configure_makes_the_kernel_choice_again_and_lets_the_old_dispatcher_go(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-problem kernel choice of attention_with_kvcache (and its prepared launches) is
    made again under a new dispatcher, and its memo holds no reference that would keep the old
    dispatcher (and its database engine) alive."""
    import gc
    import weakref
    from types import SimpleNamespace

    from autotune.model.problem import Problem
    from autotune.runtime import attention as attention_module
    from autotune.runtime import kvcache

    made: list[Any] = []
    monkeypatch.setattr(kvcache, "decode_choice", lambda problem, device: None)
    monkeypatch.setattr(
        kvcache,
        "decode_kernel",
        lambda config, **kw: (
            made.append(1)
            or SimpleNamespace(num_splits=1, pack_gqa=True, block_m=16, block_n=64, device=0)
        ),
    )
    monkeypatch.setattr(kvcache, "_sm_count", lambda device: 132)
    problem = Problem(1, 32, 8, 1, 8192, 128, "bf16", False)
    attention_module.configure(db=f"sqlite:///{tmp_path}/a.db", use_shipped=False)
    try:
        old = weakref.ref(attention_module.dispatcher())
        kvcache._resolve(problem, 0, None)
        kvcache._resolve(problem, 0, None)
        assert len(made) == 1
        attention_module.configure(db=f"sqlite:///{tmp_path}/b.db", use_shipped=False)
        kvcache._resolve(problem, 0, None)
        assert len(made) == 2
        gc.collect()
        assert old() is None
    finally:
        attention_module.configure()


@pytest.mark.parametrize("layout", ["blhd", "bhld"])
@pytest.mark.parametrize("page_size", [0, 8])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("new", [0, 2])
def test_the_cpu_computes_through_torch(
    layout: str, page_size: int, causal: bool, new: int
) -> None:
    """CPU tensors (and fp32) are computed through torch with the kernels' contract (issue 40
    item 4): the append, per-sequence lengths (an empty one: O = 0, LSE = -inf), paged caches,
    bottom-right causal alignment, NaN-poisoned rows past the lengths never reaching the
    output; against the fp32 reference the validator uses."""
    import warnings

    from autotune.measure.reference import reference_with_kvcache

    case = KVCase.make(
        batch=3,
        heads_q=4,
        heads_kv=2,
        seqlen_q=3,
        capacity=32,
        lengths=(new, 20, 32),
        head_dim=16,
        dtype="bf16",
        page_size=page_size,
        layout=layout,
        new=new,
        causal=causal,
    )
    x = make_kv_inputs(case, "cpu", 3)
    after = None
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        out, lse = attention_with_kvcache(
            x.q,
            x.k_cache,
            x.v_cache,
            k_new=x.k_new,
            v_new=x.v_new,
            cache_seqlens=x.cache_seqlens,
            block_table=x.block_table,
            causal=causal,
            return_lse=True,
            layout=layout,
        )
    assert x.cache_seqlens is not None
    after = x.cache_seqlens + new
    want, want_lse = reference_with_kvcache(
        x.q,
        x.k_cache,
        x.v_cache,
        cache_seqlens=after,
        block_table=x.block_table,
        causal=causal,
        scale=16**-0.5,
        layout=layout,
    )
    got = out if layout == "bhld" else out.transpose(1, 2)
    assert out.dtype == x.q.dtype and out.shape == x.q.shape
    torch.testing.assert_close(got.float(), want, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, want_lse)
    if new == 0:  # the empty sequence
        assert torch.equal(got[0], torch.zeros_like(got[0]))
        assert bool(torch.isneginf(lse[0]).all())


def test_fp32_and_strict_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    import autotune.runtime.kvcache as kvcache
    from autotune.runtime.attention import Unsupported

    monkeypatch.setattr(kvcache, "_warned", set())  # said once per reason and process

    case = KVCase.make(
        batch=2,
        heads_q=4,
        heads_kv=2,
        seqlen_q=1,
        capacity=16,
        lengths=(3, 16),
        head_dim=16,
        dtype="fp16",
    )
    x = make_kv_inputs(case, "cpu", 4)
    q, k, v = (t.float() for t in (x.q, x.k_cache, x.v_cache))
    with pytest.warns(UserWarning, match="computed by torch"):
        out = attention_with_kvcache(q, k, v, cache_seqlens=x.cache_seqlens)
    assert out.dtype == torch.float32 and bool(torch.isfinite(out).all())
    with pytest.raises(Unsupported, match="strict"):
        attention_with_kvcache(q, k, v, cache_seqlens=x.cache_seqlens, strict=True)
