"""The shape sets: every one loads, and the decode family's tuning set is what issue 15 asks
for (llm-decode's grid plus Lq 4 and 8, GQA 16, MQA and MHA points, ~100 problems, none larger
than 16 GiB of K and V), all within the decode family's query lengths."""

from __future__ import annotations

from autotune.model.shapes import load_shape_set, shape_sets
from autotune.model.space import load_space


def test_every_shape_set_loads() -> None:
    for name in shape_sets():
        assert load_shape_set(name), name


def test_the_decode_tuning_set() -> None:
    problems = load_shape_set("decode-tuning")
    assert 95 <= len(problems) <= 110 and len(set(problems)) == len(problems)
    assert set(load_shape_set("llm-decode")) <= set(problems)
    decode = load_space("decode")
    assert all(decode.serves(p.seqlen_q) for p in problems)
    assert {p.seqlen_q for p in problems} == {1, 4, 16}
    assert {p.group_size for p in problems} >= {1, 4, 8, 16, 32}  # MHA, GQA, GQA 16, MQA
    assert all(p.causal for p in problems if p.seqlen_q > 1)
    assert all(4 * p.batch * p.heads_kv * p.seqlen_k * p.head_dim <= 16 * 2**30 for p in problems)
