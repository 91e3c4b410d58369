"""Hostile names: a kernel family is a name from the installed space files, never a path, and
every path built from stored or imported data stays inside its root."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from autotune._paths import search_spaces_dir
from autotune.build.cache import ArtifactCache
from autotune.build.codegen import render
from autotune.model.config import Config, InvalidConfig
from autotune.model.space import load_space
from autotune.store.repo import BrokenRow, TuningStore

from .conftest import export_doc, export_entry, sm80_config


@pytest.fixture
def planted_family(tmp_path: Path) -> str:
    """A space file planted outside the package whose C++ text is an attack, and the `family`
    string that reaches it from search_spaces/ ('../../..../evil')."""
    text = (search_spaces_dir() / "sm80.toml").read_text()
    text = re.sub(r"^traits = .*$", 'traits = "int; asm(\\"trap;\\")"', text, flags=re.M)
    text = text.replace('family = "sm80"', 'family = "EVIL"')
    evil = tmp_path / "planted" / "evil.toml"
    evil.parent.mkdir()
    family = os.path.relpath(evil.with_suffix(""), search_spaces_dir())
    evil.write_text(text.replace('family = "EVIL"', f'family = "{family}"'))
    return family


def test_an_imported_family_cannot_reach_a_space_file_outside_the_package(
    planted_family: str, tmp_path: Path
) -> None:
    entry = export_entry(family=planted_family, config=sm80_config(family=planted_family))
    store = TuningStore(f"sqlite:///{tmp_path}/t.db")
    with pytest.raises(BrokenRow, match="unknown kernel family"):
        store.import_results(export_doc([entry]))
    assert store.list_best() == []


def test_no_cpp_is_generated_for_a_family_that_is_a_path(planted_family: str) -> None:
    values = {k: v for k, v in sm80_config().items() if k != "family"}
    with pytest.raises(InvalidConfig, match="unknown kernel family"):
        render(Config.make(planted_family, values))
    with pytest.raises(InvalidConfig, match="unknown kernel family"):
        load_space(planted_family)


@pytest.mark.parametrize(
    "family", ["../sm80", "sm80/../sm80", "/etc/passwd", "sm80\0", "SM80", "sm80.toml", " sm80"]
)
def test_a_family_is_a_plain_name(family: str) -> None:
    with pytest.raises(InvalidConfig):
        Config.from_dict(sm80_config(family=family))


@pytest.mark.parametrize(
    "family, key",
    [
        ("../../outside", "0" * 32),
        ("sm80", "../../../outside"),
        ("sm80", "/abs/olute"),
        ("sm80", "00ff" * 8 + "/.."),
    ],
)
def test_cache_paths_stay_inside_the_cache_root(tmp_path: Path, family: str, key: str) -> None:
    cache = ArtifactCache(tmp_path / "cache")
    with pytest.raises(ValueError, match="cache"):
        cache.path_for(family, key)
    with pytest.raises(ValueError, match="cache"):
        cache.get(family, key)
    assert not (tmp_path / "outside").exists()
