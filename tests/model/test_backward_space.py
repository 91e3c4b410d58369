"""The backward family's space: loaded apart from the forward families, so that no forward path
(dispatch, tuning, the runtime's defaults) ever sees it, and built through the same codegen."""

from __future__ import annotations

import pytest

from autotune.build.codegen import render
from autotune.build.toolchain import family_source_hash, kernel_source_hash
from autotune.model.space import (
    BACKWARD,
    FORWARD,
    all_families,
    backward_families,
    default_config,
    families,
    kernel_families,
    load_space,
)
from autotune.model.target import target_for_arch

H200 = target_for_arch("sm_90")


def test_backward_families_are_apart_from_the_forward_ones() -> None:
    assert "bwd" in backward_families()
    assert "bwd" not in families() and "bwd" not in kernel_families()
    assert set(all_families()) == set(families()) | set(backward_families())
    assert load_space("bwd").direction == BACKWARD
    assert all(load_space(f).direction == FORWARD for f in families())
    # the forward default for a problem never comes from a backward space
    config = default_config({"head_dim": 128, "dtype": "bf16", "causal": True}, H200)
    assert config is not None and config.family in families()


def test_entry_and_info_symbols_follow_the_direction() -> None:
    assert load_space("bwd").entry_symbol == "cute_autotune_bwd"
    assert load_space("bwd").info_symbol == "cute_autotune_bwd_info"
    assert load_space("sm80").entry_symbol == "cute_autotune_fwd"


@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_every_head_dim_has_a_default_that_fits_the_h200(head_dim: int) -> None:
    space = load_space("bwd")
    for dtype in ("fp16", "bf16"):
        for causal in (False, True):
            config = space.heuristic({"head_dim": head_dim, "dtype": dtype, "causal": causal})
            assert config is not None
            assert not space.violations(config, H200)
            text = render(config).text
            assert '#include "bwd/kernel.cuh"' in text and "CUTE_AUTOTUNE_BWD_ENTRY" in text


def test_the_space_has_real_choices_at_each_head_dim() -> None:
    space = load_space("bwd")
    for head_dim in (64, 96, 128, 256):
        configs = space.valid_configs(
            H200, {"head_dim": head_dim, "dtype": "bf16", "causal": True}
        )
        assert len(configs) >= 8
        for name in ("stages", "swizzle", "dq_warps_m"):
            assert len({c[name] for c in configs}) >= 2, (head_dim, name)


def test_its_sources_leave_the_forward_families_builds_alone() -> None:
    """Its folder is its own: no forward family's build key covers kernel_src/bwd/, so a
    change there rebuilds (and re-measures) nothing of the forward's."""
    for family in families():
        space = load_space(family)
        if space.compiled:
            assert "bwd" not in space.sources
            assert family_source_hash(space) == kernel_source_hash(
                space.header.split("/")[0], *space.sources
            )
    assert family_source_hash(load_space("bwd")) == kernel_source_hash("bwd")


def test_the_direction_is_checked() -> None:
    from autotune.model.space import Space

    data = {
        "family": "x",
        "direction": "sideways",
        "gencode": "g",
        "header": "x/k.cuh",
        "entry_macro": "E",
        "traits": "T",
        "name": "n",
        "params": {},
    }
    with pytest.raises(ValueError, match="direction 'sideways'"):
        Space(data)
