from __future__ import annotations

import pickle
import tomllib

import pytest

from autotune._paths import search_spaces_dir
from autotune.model.config import Config, InvalidConfig
from autotune.model.space import (
    Space,
    ValidConfig,
    load_space,
    supported_families,
    unsupported_reason,
    validate_config,
)
from autotune.model.target import target_for_arch

H200 = target_for_arch("sm_90")


@pytest.fixture
def space() -> Space:
    return load_space("sm80")


def base(space: Space, **changes: object) -> Config:
    values = {
        "head_dim": 128,
        "dtype": "fp16",
        "causal": False,
        "block_m": 128,
        "block_n": 64,
        "num_warps": 4,
        "kv_stages": 2,
        "swizzle": 3,
        "q_in_regs": False,
    }
    values.update(changes)
    return Config.make("sm80", values)  # type: ignore[arg-type]


def test_valid_config_counts_on_sm90(space: Space) -> None:
    counts = {
        (d, dtype): len(space.valid_configs(H200, {"head_dim": d, "dtype": dtype}))
        for d in (32, 64, 96, 128, 256)
        for dtype in ("fp16", "bf16")
    }
    # Both causal values, hence even numbers; the counts follow from the constraints in
    # search_spaces/sm80.toml (see the docstring of each constraint) and are pinned so that a
    # change to the space is a visible decision.
    assert counts[(128, "fp16")] == 180 and counts[(64, "bf16")] == 216
    assert counts[(32, "fp16")] == 192 and counts[(96, "fp16")] == 180
    assert counts[(256, "fp16")] == 96
    assert all(counts[(d, "fp16")] == counts[(d, "bf16")] for d in (32, 64, 96, 128, 256))


def test_every_constraint_can_fire(space: Space) -> None:
    cases = {
        "each warp owns 16-row": base(space, block_m=64, num_warps=8),
        "rows one tiled copy moves": base(
            space, head_dim=32, block_m=128, num_warps=8, block_n=32, swizzle=2
        ),
        "swizzle is either 0": base(space, swizzle=2),
        "exceeds the device limit": base(
            space, head_dim=256, block_m=128, block_n=128, num_warps=8, kv_stages=3
        ),
        "224 registers": base(space, block_n=128),
    }
    for fragment, config in cases.items():
        reasons = space.violations(config, H200)
        assert any(fragment in r for r in reasons), (fragment, reasons)


def test_smaller_devices_prune_more(space: Space) -> None:
    config = base(space, head_dim=128, block_m=64, block_n=128, kv_stages=3, q_in_regs=True)
    assert space.is_valid(config, H200)  # 208 KB of shared memory
    assert "exceeds the device limit" in space.violations(config, target_for_arch("sm_86"))[0]


def test_domain_errors_name_every_problem(space: Space) -> None:
    broken = Config.make(
        "sm80", {"head_dim": 100, "dtype": "fp8", "causal": 1, "block_m": 128, "bogus": 3}
    )
    with pytest.raises(InvalidConfig) as info:
        space.validate(broken)
    text = "\n".join(info.value.reasons)
    for fragment in (
        "unknown parameter 'bogus'",
        "missing parameter 'block_n'",
        "head_dim = 100",
        "dtype = 'fp8'",
        "causal = 1",
    ):
        assert fragment in text


def test_validate_config_refuses_unknown_families() -> None:
    with pytest.raises(InvalidConfig, match="unknown kernel family 'sm70'"):
        validate_config(Config.make("sm70", {"head_dim": 64}))


def test_rendering_uses_only_whitelisted_spellings(space: Space) -> None:
    config = base(space, dtype="bf16", causal=True, q_in_regs=True)
    assert space.traits_of(config) == (
        "cute_autotune::sm80::FwdTraits<128, 128, 64, 4, 2, 3, true, cutlass::bfloat16_t, true>"
    )
    assert space.name_of(config) == "fwd_sm80_d128_bm128_bn64_w4_s2_sw3_qr_bf16_causal"
    evil = Config.make("sm80", {**dict(config.values), "dtype": 'half_t>; system("rm");'})
    with pytest.raises(InvalidConfig):
        space.traits_of(evil)


def test_derived_values_match_the_traits_formulas(space: Space) -> None:
    derived = space.derived_values(base(space, kv_stages=3, q_in_regs=True), H200)
    assert derived["smem_bytes"] == (128 + 2 * 3 * 64) * 128 * 2
    assert derived["accum_regs"] == (128 * 64 + 128 * 128 + 128 * 128 // 2) // 128
    assert derived["copy_rows"] == 16 and derived["threads"] == 128


def test_space_file_errors_are_reported() -> None:
    with pytest.raises(ValueError, match="not a folder name"):
        Space(
            {
                "family": "x",
                "gencode": "",
                "header": "x/y.cuh",
                "entry_macro": "E",
                "traits": "T",
                "name": "n",
                "sources": ["../etc"],
                "params": {"a": {"role": "tunable", "values": [1]}},
            }
        )
    with pytest.raises(ValueError, match="uses unknown"):
        Space(
            {
                "family": "x",
                "gencode": "",
                "header": "x/y.cuh",
                "entry_macro": "E",
                "traits": "T",
                "name": "n",
                "params": {"a": {"role": "tunable", "values": [1]}},
                "constraints": [{"expr": "b > 1", "message": "m"}],
            }
        )


@pytest.mark.parametrize(
    "cc, expected",
    [
        (75, []),
        (80, ["decode", "sm80"]),
        (86, ["decode", "sm80"]),
        (90, ["decode", "decode90", "sm80", "sm90"]),
        (100, ["decode", "sm80"]),
    ],
)
def test_families_a_target_supports_come_from_the_space_files(
    cc: int, expected: list[str]
) -> None:
    assert supported_families(cc) == expected
    if cc in (80, 90):
        assert supported_families(target_for_arch(cc)) == expected


def test_no_family_for_an_old_gpu_says_what_each_needs() -> None:
    reason = unsupported_reason(75)
    assert "sm_75 is older than any kernel family supports" in reason
    assert "sm80 needs sm_80 and newer" in reason and "sm90 needs sm_90 only" in reason


def test_validate_makes_a_valid_config_once(space: Space) -> None:
    plain = base(space)
    valid = space.validate(plain)
    assert isinstance(valid, ValidConfig) and valid.space is space
    assert valid == plain and hash(valid) == hash(plain) and valid.digest == plain.digest
    assert space.validate(valid) is valid and validate_config(valid) is valid  # not again
    assert space.config(**dict(plain.values)) == valid
    assert all(isinstance(c, ValidConfig) for c in space.valid_configs(H200, {"head_dim": 64}))
    assert isinstance(
        space.heuristic({"head_dim": 128, "dtype": "fp16", "causal": False}), ValidConfig
    )
    assert type(valid.replace(swizzle=0)) is Config  # a changed config is checked again


def test_a_valid_config_is_made_only_by_validation(space: Space) -> None:
    with pytest.raises(TypeError, match="Space.validate"):
        ValidConfig("sm80", base(space).values)
    with pytest.raises(InvalidConfig):
        space.validate(base(space, block_m=96))
    other = Space(
        {
            "family": "sm80",
            "gencode": "",
            "header": "sm80/x.cuh",
            "entry_macro": "E",
            "traits": "T",
            "name": "n",
            "params": {"block_m": {"role": "tunable", "values": [128]}},
        }
    )
    with pytest.raises(InvalidConfig):  # valid in one space is not valid in another
        other.validate(space.validate(base(space)))


def test_validity_does_not_cross_a_process_boundary(space: Space) -> None:
    valid = space.validate(base(space))
    received = pickle.loads(pickle.dumps(valid))
    assert type(received) is Config and received == valid  # checked again where it arrives


def test_a_launch_parameter_is_searched_but_not_built() -> None:
    space = load_space("decode")
    assert "num_splits" in [p.name for p in space.tunable_params]
    assert [p.name for p in space.launch_params] == ["num_splits"]
    config = space.config(
        head_dim=64,
        dtype="fp16",
        causal=False,
        block_m=16,
        block_n=64,
        num_warps=4,
        kv_stages=2,
        pack_gqa=True,
        num_splits=8,
    )
    view = space.build_view(config)
    assert view["num_splits"] == 1 and view.replace(num_splits=8) == config
    assert "{num_splits}" not in space.traits_template
    assert space.traits_of(view) == space.traits_of(config)
    assert space.name_of(view) != space.name_of(config)  # stored rows stay distinguishable
    assert space.build_view(view) is view
    assert (
        load_space("sm80").build_view(
            load_space("sm80").heuristic({"head_dim": 64, "dtype": "fp16", "causal": False})
        )
        is not None
    )


def test_a_parameter_added_later_reads_as_its_default_in_configs_stored_before() -> None:
    """decode90's ctas_per_sm came after configs of the family were stored (db/h200.json, users'
    databases): such a config reads as ctas_per_sm = 1, the kernel it was built and timed as,
    under the name it had. A value outside the parameter's domain is still refused, and so is a
    space file whose default is not one of the values."""
    space = load_space("decode90")
    stored = {
        "block_m": 64,
        "block_n": 128,
        "causal": False,
        "consumer_wgs": 1,
        "dtype": "bf16",
        "head_dim": 128,
        "kv_stages": 2,
        "num_splits": 8,
        "overlap": False,
    }
    config = space.validate(Config.make("decode90", stored))
    assert config["ctas_per_sm"] == 1
    assert space.name_of(config) == "dec90_d128_bm64_bn128_wg1_s2_o0_x8_bf16_full"
    assert space.name_of(config.replace(ctas_per_sm=2)) == (
        "dec90_d128_bm64_bn128_wg1_s2_o0_c2_x8_bf16_full"
    )
    with pytest.raises(InvalidConfig, match="ctas_per_sm = 3"):
        space.validate(Config.make("decode90", {**stored, "ctas_per_sm": 3}))
    with pytest.raises(InvalidConfig, match="missing parameter 'block_n'"):
        space.validate(
            Config.make("decode90", {k: v for k, v in stored.items() if k != "block_n"})
        )
    data = tomllib.loads((search_spaces_dir() / "decode90.toml").read_text())
    data["params"]["ctas_per_sm"]["default"] = 4
    with pytest.raises(ValueError, match="default 4 is not one of"):
        Space(data, "decode90.toml")
