"""Compile-only tests with the real nvcc (no GPU needed): a handful of configs, kept small."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune._paths import kernel_src_dir
from autotune.build import compiler
from autotune.build.cache import ArtifactCache
from autotune.build.compiler import BuildResult, compile_config, compile_many, lookup
from autotune.build.cubin import read_launch_info
from autotune.model.config import Config
from autotune.model.occupancy import ctas_per_sm
from autotune.model.space import Space, load_space
from autotune.model.target import target_for_arch

pytestmark = pytest.mark.nvcc
H200 = target_for_arch("sm_90")


def sm80(
    d: int,
    dtype: str,
    causal: bool,
    bm: int,
    bn: int,
    w: int,
    stages: int,
    swizzle: int,
    q_in_regs: bool,
) -> Config:
    return load_space("sm80").config(
        head_dim=d,
        dtype=dtype,
        causal=causal,
        block_m=bm,
        block_n=bn,
        num_warps=w,
        kv_stages=stages,
        swizzle=swizzle,
        q_in_regs=q_in_regs,
    )


# (config, spills expected): fp16 and bf16, causal, 3 stages, Q in registers, D=256, and the
# FlashAttention-2 default tile for D=128, which spills a little at 255 registers.
HANDFUL = [
    (sm80(128, "fp16", True, 128, 128, 8, 2, 0, False), False),
    (sm80(64, "bf16", False, 128, 64, 8, 3, 0, False), False),
    (sm80(128, "fp16", True, 64, 128, 4, 3, 3, True), False),
    (sm80(256, "fp16", True, 64, 64, 4, 2, 3, False), False),
    (sm80(128, "fp16", False, 128, 64, 4, 2, 3, False), True),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[BuildResult]]]:
    root = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("CUTE_AUTOTUNE_CACHE", str(root))
    results = compile_many([c for c, _ in HANDFUL], H200, jobs=2, cache=ArtifactCache(root))
    yield root, results
    mp.undo()


def test_handful_compiles_with_the_expected_spills(built: tuple[Path, list[BuildResult]]) -> None:
    _, results = built
    for (_, spills), result in zip(HANDFUL, results, strict=True):
        assert result.ok, result.message
        assert result.ptxas is not None and result.ptxas.registers <= 255
        assert result.ptxas.spills == spills, (result.name, result.ptxas)
        assert result.ptxas.arch == "sm_90" and result.seconds > 0 and not result.cached


def test_the_cubin_declares_what_the_space_derives(built: tuple[Path, list[BuildResult]]) -> None:
    space = load_space("sm80")
    for result in built[1]:
        assert result.cubin is not None
        info = read_launch_info(result.cubin)
        derived = space.derived_values(result.config, H200)
        config = result.config
        assert info == result.launch_info
        assert (info.abi_version, info.family, info.persistent, info.tma_box_cols) == (3, 80, 0, 0)
        assert (info.pack_gqa, info.split_kv) == (0, 0)
        assert info.smem_bytes == derived["smem_bytes"] and info.threads == derived["threads"]
        assert (info.block_m, info.block_n, info.head_dim) == (
            config["block_m"],
            config["block_n"],
            config["head_dim"],
        )
        assert info.dtype == {"fp16": 0, "bf16": 1}[str(config["dtype"])]
        assert info.causal == int(bool(config["causal"]))


@pytest.mark.parametrize("pack", [False, True])
def test_a_decode_kernel_declares_its_split_kv_entry(tmp_path: Path, pack: bool) -> None:
    space = load_space("decode")
    config = space.config(
        head_dim=128,
        dtype="bf16",
        causal=pack,
        block_m=16,
        block_n=64,
        num_warps=2,
        kv_stages=2,
        pack_gqa=pack,
        num_splits=1,
    )
    # The split count is a launch parameter: a batch of counts compiles once (one nvcc run,
    # one cubin), and another count later is the same build, from the cache.
    many = compile_many(
        [config.replace(num_splits=n) for n in (1, 2, 64)],
        H200,
        jobs=2,
        cache=ArtifactCache(tmp_path),
    )
    assert [r.ok for r in many] == [True] * 3, [r.message for r in many]
    assert len({r.cubin for r in many}) == 1 and len(list(tmp_path.rglob("*.cubin"))) == 1
    assert [r.config["num_splits"] for r in many] == [1, 2, 64]
    result = compile_config(config, H200, ArtifactCache(tmp_path))
    assert result.ok and result.cubin is not None, result.message
    assert result.cached and result.cubin == many[0].cubin
    info = read_launch_info(result.cubin)
    derived = space.derived_values(config, H200)
    assert (info.abi_version, info.split_kv, info.pack_gqa) == (3, 1, int(pack))
    assert info.smem_bytes == derived["smem_bytes"] and info.threads == derived["threads"]
    assert b"cute_autotune_combine" in result.cubin.read_bytes()
    # its splits always go through the combine entry: no in-cluster combine mark
    assert b"cute_autotune_cluster_combine" not in result.cubin.read_bytes()
    again = compile_config(config.replace(num_splits=16), H200, ArtifactCache(tmp_path))
    assert again.cached and again.cubin == result.cubin and again.config["num_splits"] == 16
    assert space.name_of(again.config) != space.name_of(config)


def test_cache_hit_and_miss(
    built: tuple[Path, list[BuildResult]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, results = built
    cache = ArtifactCache(root)
    config = results[0].config
    again = compile_config(config, H200, cache)
    assert again.cached and again.cubin == results[0].cubin and again.key == results[0].key
    # The key moves with the target, the kernel sources and the compiler flags.
    assert lookup(config, target_for_arch("sm_80"), cache) is None
    assert lookup(config.replace(swizzle=3), H200, cache) is None
    monkeypatch.setattr(compiler, "NVCC_FLAGS", [*compiler.NVCC_FLAGS, "-lineinfo"])
    assert lookup(config, H200, cache) is None
    monkeypatch.undo()
    monkeypatch.setattr(compiler, "family_source_hash", lambda space: "0" * 16)
    assert lookup(config, H200, cache) is None
    monkeypatch.undo()
    assert lookup(config, H200, cache) is not None
    # A damaged entry is a miss, not a crash.
    (results[0].cubin.parent / "build.json").write_text("{broken")  # type: ignore[union-attr]
    assert lookup(config, H200, cache) is None


def test_generated_source_is_kept_with_the_artifact(built: tuple[Path, list[BuildResult]]) -> None:
    result = built[1][1]
    assert result.cubin is not None
    sources = list(result.cubin.parent.glob("*.cu"))
    assert [p.name for p in sources] == [f"{result.name}.cu"]
    assert result.config.to_json() in sources[0].read_text()


def test_pruned_config_never_reaches_nvcc(tmp_path: Path) -> None:
    impossible = load_space("sm80").config(
        head_dim=128,
        dtype="fp16",
        causal=False,
        block_m=64,
        block_n=64,
        num_warps=8,
        kv_stages=2,
        swizzle=3,
        q_in_regs=False,
    )
    start = time.perf_counter()
    result = compile_config(impossible, H200, ArtifactCache(tmp_path))
    assert result.status == "invalid" and time.perf_counter() - start < 1.0
    assert "multiple of 16 * num_warps" in result.message
    assert not (tmp_path / "cubins").exists()


def test_impossible_config_fails_at_nvcc_with_the_static_assert(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pretend the Python check missed it: the traits' static_assert must still say why.
    monkeypatch.setattr(Space, "violations", lambda self, config, target: [])
    impossible = Config.make(
        "sm80",
        {
            "head_dim": 128,
            "dtype": "fp16",
            "causal": False,
            "block_m": 64,
            "block_n": 64,
            "num_warps": 8,
            "kv_stages": 2,
            "swizzle": 3,
            "q_in_regs": False,
        },
    )
    result = compile_config(impossible, H200, ArtifactCache(tmp_path))
    assert result.status == "compile_error"
    assert (
        "static_assert: block_m must be a multiple of 16 * num_warps (each warp owns 16-row "
        "MMA slabs)"
    ) in result.message


def test_nvcc_timeout_is_a_result(tmp_path: Path, real_nvcc: None) -> None:
    config = HANDFUL[0][0]
    result = compile_config(config, H200, ArtifactCache(tmp_path), timeout=0.5, force=True)
    assert result.status == "timeout" and "did not finish" in result.message


def test_static_asserts_mirror_every_space_constraint() -> None:
    """Each constraint message of the space (but the swizzle policy and the device limit, which
    depend on the target) appears verbatim in a static_assert of the traits."""
    traits = (kernel_src_dir() / "sm80" / "traits.cuh").read_text()
    asserted = " ".join(re.findall(r'static_assert\([^;]*?"((?:[^"]|"\s*")*)"\);', traits, re.S))
    asserted = re.sub(r'"\s*"', "", asserted)
    for constraint in load_space("sm80").constraints:
        if "swizzle is either" in constraint.message:
            continue  # a policy of the space (partial swizzles are dominated), not a limit
        assert constraint.message in asserted, constraint.message


def test_decode90_marks_its_in_cluster_combine(tmp_path: Path) -> None:
    """decode90 reduces its splits inside a thread-block cluster when launched with one; its
    cubin says so to the launcher by exporting the mark of launcher/cluster_combine.h (without
    it the launcher would quietly use the combine entry), and still carries that entry."""
    space = load_space("decode90")
    config = space.config(
        head_dim=128,
        dtype="bf16",
        causal=False,
        block_m=64,
        block_n=128,
        consumer_wgs=1,
        kv_stages=3,
        overlap=False,
        num_splits=8,
    )
    result = compile_config(config, H200, ArtifactCache(tmp_path))
    assert result.ok and result.cubin is not None, result.message
    assert result.ptxas is not None and not result.ptxas.spills
    assert result.ptxas.wgmma_serialized == ""
    data = result.cubin.read_bytes()
    assert b"cute_autotune_cluster_combine" in data and b"cute_autotune_combine" in data
    assert read_launch_info(result.cubin).split_kv == 1


def test_decode90_two_ctas_per_sm_fit_an_sm(tmp_path: Path) -> None:
    """ctas_per_sm = 2 builds for two resident CTAs: the launch bounds hold ptxas to 128
    registers a thread (two CTAs of 256 threads fill the 64K register file), no spills, the
    wgmmas still pipelined, and the occupancy the cubin allows is two CTAs. The same tile at
    ctas_per_sm = 1 (what configs stored before the parameter mean) gets the whole file."""
    space = load_space("decode90")
    values = dict(
        head_dim=128,
        dtype="bf16",
        causal=True,
        block_m=64,
        block_n=64,
        consumer_wgs=1,
        kv_stages=2,
        overlap=True,
        num_splits=1,
    )
    two = compile_config(space.config(**values, ctas_per_sm=2), H200, ArtifactCache(tmp_path))
    assert two.ok and two.ptxas is not None and two.launch_info is not None, two.message
    assert two.ptxas.registers <= 128 and not two.ptxas.spills
    assert two.ptxas.wgmma_serialized == ""
    resident = ctas_per_sm(
        90, two.ptxas.registers, two.launch_info.threads, two.launch_info.smem_bytes
    )
    assert resident["ctas"] == 2, resident
    one = compile_config(space.config(**values), H200, ArtifactCache(tmp_path))
    assert one.ok and one.ptxas is not None and one.launch_info is not None, one.message
    assert one.ptxas.registers > 128
    assert (
        ctas_per_sm(90, one.ptxas.registers, one.launch_info.threads, one.launch_info.smem_bytes)[
            "ctas"
        ]
        == 1
    )


def test_sm90_family_compiles_for_sm90a(tmp_path: Path) -> None:
    """The Hopper family builds for the arch-specific target with no spills (the persistent,
    ping-pong variant: the one whose loop once spilled) and with its wgmmas pipelined (a
    kernel v3 draft had ptxas serialise them all and ran at 0.76x), declares its launch
    (one producer warpgroup + consumers) in its LaunchInfo, and is refused for a GPU that is
    not sm_90."""
    space = load_space("sm90")
    config = space.config(
        head_dim=128,
        dtype="bf16",
        causal=True,
        block_m=128,
        block_n=128,
        consumer_wgs=2,
        kv_stages=2,
        producer_regs=24,
        overlap=True,
        pingpong=True,
        persistent=True,
    )
    result = compile_config(config, H200, ArtifactCache(tmp_path))
    assert result.ok, result.message
    assert result.record["gencode"] == "arch=compute_90a,code=sm_90a"
    assert result.ptxas is not None and not result.ptxas.spills
    assert result.ptxas.wgmma_serialized == ""
    info = result.launch_info
    assert info is not None and (info.family, info.threads, info.block_m) == (90, 384, 128)
    assert (info.persistent, info.tma_box_cols, info.tma_swizzle_bytes) == (1, 64, 128)
    assert (info.tma_box_rows_q, info.tma_box_rows_k, info.tma_box_rows_o) == (128, 128, 64)
    tiles = space.derived_values(config, H200)["smem_bytes"]
    assert tiles <= info.smem_bytes < tiles + 2048  # tiles, then mbarriers and alignment
    refused = compile_config(config, target_for_arch("sm_80"), ArtifactCache(tmp_path))
    assert refused.status == "invalid" and "compute capability 90..90" in refused.message
