"""Make a kernel pack (pack.py describes the format): compile what the cubin cache lacks, copy
each cubin with its build record out of the cache, add the prebuilt launcher extension, and
write the manifest and the two files that make the folder a pip-installable package.

The pack is written beside its destination and renamed into place, so a failed or interrupted
run leaves the previous pack as it was; an existing folder is replaced only if it is a pack.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from ..model.config import Config, InvalidConfig
from ..model.space import load_space
from ..model.target import Target
from .cache import CUBIN, DIGEST, RECORD, ArtifactCache
from .compiler import NVCC_FLAGS, BuildResult, compile_many
from .pack import (
    CUBINS,
    FORMAT,
    FORMAT_VERSION,
    LAUNCHERS,
    MANIFEST,
    PACKAGE,
    LauncherFile,
    PackError,
    pack_folder,
    pack_key,
    sha256_of,
)
from .toolchain import family_source_hash, toolchain

DISTRIBUTION = "cute-autotune-kernels"


@dataclass(frozen=True)
class PackReport:
    out: Path
    builds: tuple[BuildResult, ...]  # one per (target, build view), in the order given
    entries: int  # cubins in the pack

    @property
    def failed(self) -> list[BuildResult]:
        return [b for b in self.builds if not b.ok]


def build_views(configs: Sequence[Config]) -> list[Config]:
    """The distinct builds `configs` run on (launch parameters stripped), in order; a config
    its space refuses stays as it is, for compile_many to report."""
    views: dict[Config, None] = {}
    for config in configs:
        try:
            space = load_space(config.family)
            if space.compiled:
                views.setdefault(space.build_view(space.validate(config)))
        except InvalidConfig:
            views.setdefault(config)
    return list(views)


def write_pack(
    out: Path,
    selections: Sequence[tuple[Target, Sequence[Config]]],
    launcher: LauncherFile,
    *,
    cache: ArtifactCache | None = None,
    jobs: int | None = None,
    on_result: Callable[[BuildResult], None] | None = None,
) -> PackReport:
    """Write the pack of `selections` (per target, the configs whose builds it holds; torch's
    configs are left out) with `launcher` to `out`. A config that does not build is reported
    in the result and left out of the pack."""
    cache = cache or ArtifactCache()
    builds: list[BuildResult] = []
    for target, configs in selections:
        builds += compile_many(
            build_views(configs), target, jobs=jobs, cache=cache, on_result=on_result
        )
    out = out.expanduser().absolute()
    _check_destination(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        package = staging / PACKAGE
        entries: dict[str, dict[str, Any]] = {}
        for build in builds:
            if build.ok:
                key, entry = _copy_build(build, package)
                entries[key] = entry
        sources = {
            e["family"]: family_source_hash(load_space(e["family"])) for e in entries.values()
        }
        shipped = _copy_launcher(launcher, package)
        archs = sorted({target.arch for target, _ in selections})
        manifest = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "archs": archs,
            "made_with": _made_with(),
            "kernel_sources": sources,
            "flags": NVCC_FLAGS,
            "launchers": [shipped],
            "entries": entries,
        }
        text = json.dumps(manifest, indent=1, sort_keys=True)
        (package / MANIFEST).write_text(text)
        (package / "__init__.py").write_text(_INIT.format(archs=", ".join(archs)))
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        local = ".".join(a.replace("_", "") for a in archs)
        (staging / "pyproject.toml").write_text(
            _PYPROJECT.format(
                name=DISTRIBUTION,
                version=f"{_version()}+{local}.{digest}",
                archs=", ".join(archs),
                package=PACKAGE,
                data=json.dumps([MANIFEST, f"{CUBINS}/*/*/*", f"{LAUNCHERS}/*/*"]),
            )
        )
        staging.chmod(0o755)  # mkdtemp's 0700 would travel with the pack
        _replace(out, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return PackReport(out, tuple(builds), len(entries))


def _check_destination(out: Path) -> None:
    """Refuse to overwrite a folder that is not a kernel pack (checked before the copying)."""
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and pack_folder(out) is None)):
        raise PackError(
            f"{out} exists and is not a kernel pack: choose another --out "
            "(an existing pack is replaced, anything else is left alone)"
        )


def _replace(out: Path, staging: Path) -> None:
    """Move the finished pack into place, the previous one (if any) aside first."""
    _check_destination(out)
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
        out.rename(old / "pack")
        staging.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        staging.rename(out)


def _copy_build(build: BuildResult, package: Path) -> tuple[str, dict[str, Any]]:
    """Copy a cached build (cubin and build.json, verbatim) into the pack; its manifest entry."""
    assert build.cubin is not None
    space = load_space(build.config.family)
    view = space.build_view(space.validate(build.config))
    record = json.loads((build.cubin.parent / RECORD).read_text())
    gencode = str(record["gencode"])
    key = pack_key(view, gencode)
    directory = package / CUBINS / space.family / key
    directory.mkdir(parents=True)
    shutil.copyfile(build.cubin, directory / CUBIN)
    shutil.copyfile(build.cubin.parent / RECORD, directory / RECORD)
    digest = sha256_of(directory / CUBIN)
    if digest != record.get(DIGEST) or record.get("config") != view.as_dict():
        # the cache verified the entry when it served it; this is a change since
        raise PackError(f"the cache entry {build.cubin.parent} changed while it was copied")
    return key, {
        "family": space.family,
        "name": space.name_of(view),
        "arch": build.arch,
        "gencode": gencode,
        "config": view.as_dict(),
        DIGEST: digest,
    }


def _copy_launcher(launcher: LauncherFile, package: Path) -> dict[str, str]:
    relative = Path(LAUNCHERS) / launcher.tag / launcher.path.name
    (package / relative).parent.mkdir(parents=True)
    shutil.copyfile(launcher.path, package / relative)
    return {
        "tag": launcher.tag,
        "suffix": launcher.suffix,
        "pybind11": launcher.pybind11,
        "file": relative.as_posix(),
        "sha256": sha256_of(package / relative),
    }


def _version() -> str:
    try:
        return version("cute-autotune")
    except PackageNotFoundError:
        return "0.0.0"


def _made_with() -> dict[str, str]:
    tools = toolchain()
    return {
        "cute_autotune": _version(),
        "nvcc": tools.nvcc_version,
        "cutlass": tools.cutlass_version,
    }


_INIT = '''"""Prebuilt cute-autotune kernels for {archs}: a kernel pack, made by
`cute-autotune kernels pack`. cute-autotune finds this package (without importing it) and loads
its cubins and its launcher extension on a GPU machine without the CUDA toolkit. Generated:
make it again rather than edit it."""

from pathlib import Path

PATH = Path(__file__).resolve().parent
'''

_PYPROJECT = """# Made by `cute-autotune kernels pack`: prebuilt cute-autotune kernels for {archs}.
# `pip install .` here installs them; cute-autotune then runs them without the CUDA toolkit.
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{version}"
description = "Prebuilt cute-autotune kernels (cubins and launcher) for {archs}"
requires-python = ">=3.11"

[tool.setuptools]
packages = ["{package}"]
include-package-data = false

[tool.setuptools.package-data]
"{package}" = {data}
"""
