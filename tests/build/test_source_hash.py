"""A family's build key covers every folder of kernel_src/ its kernels include: decode90 builds
on the sm90 family's CTA, the decode family's combine and the launcher's in-cluster combine
protocol (launcher/cluster_combine.h), so a change there rebuilds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.build import toolchain
from autotune.model.space import load_space


def _tree(root: Path) -> None:
    for folder in ("common", "decode", "decode90", "sm90", "launcher"):
        (root / folder).mkdir(parents=True)
        (root / folder / "a.cuh").write_text(f"// {folder}\n")
    (root / "launcher" / "launcher.cpp").write_text("// host only\n")
    (root / "fwd_params.h").write_text("// shared\n")


def test_an_included_familys_sources_are_part_of_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path)
    monkeypatch.setattr(toolchain, "kernel_src_dir", lambda: tmp_path)
    digest = toolchain.kernel_source_hash.__wrapped__  # uncached: the tree changes below
    space = load_space("decode90")
    assert set(space.sources) == {"decode", "sm90", "launcher"}
    before = digest("decode90", *space.sources)
    alone = digest("decode90")
    (tmp_path / "sm90" / "a.cuh").write_text("// sm90, changed\n")
    assert digest("decode90", *space.sources) != before
    assert digest("decode90") == alone  # without the sources key the change would go unseen
    (tmp_path / "decode" / "a.cuh").write_text("// decode, changed\n")
    assert digest("decode90", *space.sources) != before
    changed = digest("decode90", *space.sources)
    (tmp_path / "launcher" / "launcher.cpp").write_text("// host only, changed\n")
    assert digest("decode90", *space.sources) == changed  # the host launcher is no device source
    (tmp_path / "launcher" / "a.cuh").write_text("// launcher protocol, changed\n")
    assert digest("decode90", *space.sources) != changed


def test_a_family_without_sources_keeps_its_key() -> None:
    """Hashing a family's own folder alone gives the key it always had (its cubins stay)."""
    for family in ("sm80", "sm90", "decode"):
        space = load_space(family)
        assert space.sources == ()
        assert toolchain.family_source_hash(space) == toolchain.kernel_source_hash(
            Path(space.header).parts[0]
        )
