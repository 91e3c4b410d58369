"""How a problem's keys are held (`Problem.kv_cache`): dense tensors, a padded cache with
per-sequence lengths, or a paged cache; a part of the problem's identity, checked like its
sizes, read from shape sets and the CLI, and honoured by the family choice of a session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune.model.problem import Problem
from autotune.model.shapes import load_shape_set
from autotune.model.target import target_for_arch
from autotune.tune.search import families_to_search

SHAPE = (8, 32, 8, 1, 32768, 128, "bf16", False)


@pytest.mark.parametrize(
    "kind, page_size",
    [
        ("dense", 0),
        ("seqlens", 0),
        ("paged1", 1),
        ("paged16", 16),
        ("paged64", 64),
        ("paged32768", 32768),
    ],
)
def test_every_kind_is_accepted_with_its_page_size(kind: str, page_size: int) -> None:
    problem = Problem(*SHAPE, kind)  # type: ignore[arg-type]
    assert problem.page_size == page_size
    assert (kind in problem.describe()) == (kind != "dense")
    assert Problem(**problem.as_dict()) == problem


@pytest.mark.parametrize(
    "kind",
    [
        "paged",
        "paged0",
        "paged48",
        "paged016",
        "paged131072",
        "Paged16",
        "paged16 ",
        "ragged",
        "",
        None,
        16,
    ],
)
def test_a_kind_that_is_not_one_is_refused(kind: object) -> None:
    with pytest.raises(ValueError, match="kv_cache must be one of"):
        Problem(*SHAPE, kind)  # type: ignore[arg-type]


def test_a_paged_cache_holds_whole_pages() -> None:
    with pytest.raises(ValueError, match="multiple of 64"):
        Problem(8, 32, 8, 1, 1000, 128, "bf16", False, "paged64")
    assert Problem(8, 32, 8, 1, 1000, 128, "bf16", False, "paged8").page_size == 8


def test_a_kind_is_part_of_the_identity() -> None:
    dense, paged = Problem(*SHAPE), Problem(*SHAPE, "paged16")  # type: ignore[arg-type]
    assert dense.kv_cache == "dense" and dense != paged and len({dense, paged}) == 2


def test_per_sequence_lengths_are_fixed_and_span_half_to_all() -> None:
    problem = Problem(64, 32, 8, 16, 8192, 128, "bf16", True, "seqlens")
    lengths = problem.cache_lengths
    assert lengths is not None and len(lengths) == 64
    assert all(4096 <= n <= 8192 for n in lengths) and len(set(lengths)) > 32
    assert lengths == Problem(64, 32, 8, 16, 8192, 128, "bf16", True, "seqlens").cache_lengths
    assert Problem(1, 32, 8, 1, 8192, 128, "bf16", False, "seqlens").cache_lengths == (6144,)
    assert Problem(*SHAPE).cache_lengths is None  # type: ignore[arg-type]
    # the bytes a call must move count the rows the sequences hold
    full = Problem(64, 32, 8, 16, 8192, 128, "bf16", True)
    assert problem.bytes < full.bytes
    kv = 2 * 2 * 8 * 128 * sum(lengths)
    assert problem.bytes - kv == full.bytes - 2 * 2 * 8 * 128 * 64 * 8192


def test_a_shape_set_names_kinds(tmp_path: Path) -> None:
    path = tmp_path / "kinds.toml"
    path.write_text(
        'dtypes = ["bf16"]\nhead_dims = [128]\ncausal = [false]\nshapes = [\n'
        "  { batch = 8, heads_q = 32, heads_kv = 8, seqlen_q = 1, seqlen_k = 4096 },\n"
        "  { batch = 8, heads_q = 32, heads_kv = 8, seqlen_q = 1, seqlen_k = 4096,"
        ' kv_cache = ["seqlens", "paged16", "paged64"] },\n]\n'
    )
    kinds = [p.kv_cache for p in load_shape_set(str(path))]
    assert kinds == ["dense", "seqlens", "paged16", "paged64"]
    path.write_text(path.read_text().replace('"paged64"', '"paged60"'))
    with pytest.raises(ValueError, match="kv_cache must be one of"):
        load_shape_set(str(path))


def test_the_decode_tuning_set_holds_each_kind() -> None:
    problems = load_shape_set("decode-tuning")
    kinds = {p.kv_cache for p in problems}
    assert kinds == {"dense", "seqlens", "paged16", "paged64"}
    assert 90 <= len(problems) <= 110
    assert all(p.seqlen_k % (p.page_size or 1) == 0 for p in problems)


class AllFamilies:
    def target(self) -> Any:
        return target_for_arch("sm_90")

    def families(self) -> list[str]:
        return ["decode", "sm80", "sm90"]


def test_only_a_family_that_reads_caches_is_searched_on_a_cache_problem() -> None:
    backend: Any = AllFamilies()
    paged = Problem(*SHAPE, "paged16")  # type: ignore[arg-type]
    assert families_to_search(backend, None, paged) == ["decode"]
    assert families_to_search(backend, ["decode", "sm90"], paged) == ["decode"]
    assert families_to_search(backend, ["sm90", "decode"], Problem(*SHAPE)) == [  # type: ignore[arg-type]
        "sm90",
        "decode",
    ]
    with pytest.raises(ValueError, match="reads a paged16 KV cache"):
        families_to_search(backend, ["sm90"], paged)


def test_decode90_reads_every_kind_but_pages_shorter_than_its_tma_boxes() -> None:
    """decode90 loads a page as TMA boxes of whole 128-byte swizzle atoms: pages of 16 rows
    and more; the decode family reads any page size. A family that reads no caches reads only
    dense keys, and a malformed kind is no page size."""
    from autotune.model.space import load_space

    decode90, decode, sm90 = load_space("decode90"), load_space("decode"), load_space("sm90")
    kinds = ("dense", "seqlens", "paged8", "paged16", "paged256")
    assert [decode90.reads(k) for k in kinds] == [True, True, False, True, True]
    assert all(decode.reads(k) for k in kinds)
    assert [sm90.reads(k) for k in kinds] == [True, False, False, False, False]
    backend: Any = AllFamilies()
    backend.families = lambda: ["decode", "decode90"]
    assert families_to_search(backend, None, Problem(*SHAPE, "paged16")) == [  # type: ignore[arg-type]
        "decode",
        "decode90",
    ]
    assert families_to_search(backend, None, Problem(*SHAPE, "paged8")) == [  # type: ignore[arg-type]
        "decode"
    ]


def test_each_kind_has_its_own_study() -> None:
    """A study holds one problem's trials: a kind sharing its dense twin's study would find the
    twin's budget spent and search nothing of its own (seen on the H200, fixed here)."""
    from autotune.store.records import DeviceInfo
    from autotune.tune.search import study_name

    device = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
    names = {
        study_name(device, "decode", Problem(*SHAPE, kind))  # type: ignore[arg-type]
        for kind in ("dense", "seqlens", "paged16", "paged64")
    }
    assert len(names) == 4
    assert study_name(device, "decode", Problem(*SHAPE)).endswith(  # type: ignore[arg-type]
        "bf16-d128-full-b8-hq32-hkv8-lq1-lk32768"
    )  # dense names as before the kind existed
