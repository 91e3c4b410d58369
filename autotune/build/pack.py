"""The kernel pack: prebuilt cubins and the launcher extension, for GPUs without the CUDA toolkit.

A GPU machine without nvcc can neither build a kernel nor find one in the cubin cache (the
cache's keys hold nvcc's version, read by running nvcc). A kernel pack, made by `cute-autotune
kernels pack` on a machine with the toolkit (pack_writer.py), carries what such a machine needs:
for one or more GPU archs, the cubin and build record (the cache's build.json, verbatim) of every
config of the shipped results, and the launcher extension built for one Python ABI. The folder
is also a tiny Python distribution: `pip install DIR` installs the package `cute_autotune_kernels`.

    DIR/pyproject.toml
    DIR/cute_autotune_kernels/__init__.py     PATH: the folder below
    DIR/cute_autotune_kernels/pack.json       the manifest (entries, sources, launchers)
    DIR/cute_autotune_kernels/cubins/<family>/<key>/{kernel.cubin, build.json}
    DIR/cute_autotune_kernels/launcher/<tag>/_cute_autotune_launcher<suffix>

An entry is found by what its cubin is, never by the compiler that made it: <key> hashes the
config's build view and the nvcc target only. What else the cubin depends on is checked against
its record, each with its own reason: the kernel sources (a pack made from other sources is not
used), the flags, and the SHA-256 of the cubin (a tampered or truncated cubin is never served).
The runtime finds the pack at $CUTE_AUTOTUNE_KERNELS (DIR, or the package folder in it), else as
the installed package `cute_autotune_kernels` (located without importing it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from ..model.config import Config
from ..model.space import ValidConfig
from ..model.status import Status
from ..model.target import Target
from .cache import CUBIN, DIGEST, RECORD
from .compiler import NVCC_FLAGS, BuildResult
from .cubin import LaunchInfo
from .ptxas import PtxasReport
from .toolchain import family_source_hash

PACKAGE = "cute_autotune_kernels"
MANIFEST = "pack.json"
FORMAT = "cute-autotune-kernel-pack"
FORMAT_VERSION = 1
ENV = "CUTE_AUTOTUNE_KERNELS"
CUBINS = "cubins"
LAUNCHERS = "launcher"
HOW_TO = "`cute-autotune kernels pack`, docs/deploy.md"

log = logging.getLogger(__name__)


class PackError(ValueError):
    """A folder that is not a usable kernel pack; the message names it and says why."""


def pack_key(view: Config, gencode: str) -> str:
    """The key of a pack entry: the config's build view and the nvcc target, nothing of the
    toolchain (a machine without nvcc must be able to compute it)."""
    material = {"config": view.to_json(), "gencode": gencode}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class LauncherFile:
    """A launcher extension built for one Python ABI, and what it must match to be imported."""

    tag: str  # launch.launcher.abi_tag(): its sources, the extension suffix, pybind11's version
    suffix: str  # importlib.machinery.EXTENSION_SUFFIXES[0] of the Python it was built for
    pybind11: str
    path: Path
    sha256: str = ""

    def describe(self) -> str:
        return f"{self.suffix}, pybind11 {self.pybind11}"


@dataclass(frozen=True)
class PackAnswer:
    """A pack lookup: the prebuilt build, or why there is none."""

    build: BuildResult | None
    reason: str = ""


class KernelPack:
    """An opened pack (its manifest read and checked); entries are verified when looked up."""

    def __init__(self, root: Path, manifest: dict[str, Any]) -> None:
        self.root = root
        self.archs: list[str] = list(manifest["archs"])
        self.sources: dict[str, str] = dict(manifest["kernel_sources"])
        self.entries: dict[str, dict[str, Any]] = dict(manifest["entries"])
        self.made_with: dict[str, str] = dict(manifest.get("made_with", {}))
        self.launchers = [
            LauncherFile(
                item["tag"], item["suffix"], item["pybind11"], Path(item["file"]), item["sha256"]
            )
            for item in manifest["launchers"]
        ]
        if not all(isinstance(entry, dict) for entry in self.entries.values()):
            raise ValueError("an entry is not an object")

    @classmethod
    def open(cls, root: Path) -> KernelPack:
        """The pack whose manifest is `root`/pack.json; PackError if there is none or it is not
        a manifest this release reads."""
        try:
            manifest = json.loads((root / MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise PackError(
                f"{root} is not a kernel pack: cannot read {MANIFEST} ({exc})"
            ) from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise PackError(f"{root / MANIFEST} is not a {FORMAT} manifest")
        if manifest.get("version") != FORMAT_VERSION:
            raise PackError(
                f"{root / MANIFEST} is of format version "
                f"{manifest.get('version')!r}; this release reads {FORMAT_VERSION}: "
                "make the pack again with this release"
            )
        try:
            return cls(root, manifest)
        except (KeyError, TypeError, ValueError) as exc:
            raise PackError(f"{root / MANIFEST} is damaged ({exc!r})") from None

    def _inside(self, relative: Path) -> Path:
        path = self.root / relative
        if relative.is_absolute() or not path.resolve().is_relative_to(self.root.resolve()):
            raise PackError(f"{self.root / MANIFEST} names {relative}, outside the pack")
        return path

    def lookup(self, config: ValidConfig, target: Target) -> PackAnswer:
        """The pack's build of `config` for `target`, verified, or why it has none."""
        space = config.space
        view = space.build_view(config)
        name = space.name_of(view)
        gencode = space.gencode_for(target)
        here = family_source_hash(space)
        if target.arch not in self.archs:
            return PackAnswer(
                None,
                f"the kernel pack {self.root} holds kernels for "
                f"{', '.join(self.archs) or 'no GPU'}, not {target.arch}",
            )
        packed = self.sources.get(space.family)
        if packed is None:
            return PackAnswer(None, f"the kernel pack {self.root} holds no {space.family} kernels")
        if packed != here:
            return PackAnswer(
                None,
                f"the kernel pack {self.root} was built from other "
                f"{space.family} kernel sources ({packed}; installed: {here}), "
                "so it is not used: make it again from this release",
            )
        key = pack_key(view, gencode)
        entry = self.entries.get(key)
        if entry is None:
            return PackAnswer(
                None, f"the kernel pack {self.root} has no build of {name} ({gencode})"
            )
        directory = self.root / CUBINS / space.family / key
        record, why = _read_record(directory)
        if record is not None:
            why = _refusal(directory, record, entry, view, gencode, here)
        if record is None or why:
            log.warning("kernel pack: refused %s in %s: %s", name, directory, why)
            return PackAnswer(None, f"the kernel pack's build of {name} is refused: {why}")
        try:
            build = BuildResult(
                config=config,
                arch=target.arch,
                status=Status.OK,
                key=record.get("key"),
                cubin=directory / CUBIN,
                ptxas=PtxasReport(**record["ptxas"]),
                launch_info=LaunchInfo(**record["launch_info"]),
                seconds=float(record.get("compile_seconds", 0.0)),
                cached=True,
                message=f"prebuilt, from the kernel pack {self.root}",
                record=record,
            )
        except (KeyError, TypeError, ValueError) as exc:
            return PackAnswer(
                None,
                f"the kernel pack's build of {name} is refused: {RECORD} "
                f"does not describe a build ({exc!r})",
            )
        return PackAnswer(build)

    def launcher(self, tag: str) -> tuple[Path | None, str]:
        """The verified launcher extension of ABI tag `tag`, else None and why."""
        for item in self.launchers:
            if item.tag != tag:
                continue
            try:
                path = self._inside(item.path)
                digest = sha256_of(path)
            except (OSError, PackError) as exc:
                return None, f"the kernel pack's launcher is unusable ({exc})"
            if digest != item.sha256:
                log.warning(
                    "kernel pack: refused the launcher %s: its SHA-256 does not match "
                    "the manifest",
                    path,
                )
                return None, (
                    f"the kernel pack's launcher {path} is refused: it does not match "
                    f"its recorded SHA-256 (damaged or replaced)"
                )
            return path, ""
        built_for = "; ".join(item.describe() for item in self.launchers) or "no Python"
        return None, (
            f"the kernel pack {self.root} holds a launcher for {built_for}, not for "
            "this Python and kernel sources"
        )


def _read_record(directory: Path) -> tuple[dict[str, Any] | None, str]:
    try:
        record = json.loads((directory / RECORD).read_text())
    except (OSError, ValueError) as exc:
        return None, f"cannot read its {RECORD} ({exc})"
    if not isinstance(record, dict):
        return None, f"its {RECORD} is not a build record"
    return record, ""


def _refusal(
    directory: Path,
    record: dict[str, Any],
    entry: dict[str, Any],
    view: Config,
    gencode: str,
    sources: str,
) -> str:
    """Why a pack entry must not be served ("" when it may): it is not the build asked for, or
    its cubin is not the one its record describes."""
    made_with = record.get("toolchain")
    if record.get("config") != view.as_dict() or record.get("gencode") != gencode:
        return (
            f"its {RECORD} describes another build ({record.get('name')}, {record.get('gencode')})"
        )
    if not isinstance(made_with, dict) or made_with.get("kernel_source") != sources:
        return (
            "it was built from other kernel sources "
            f"({made_with.get('kernel_source') if isinstance(made_with, dict) else None}; "
            f"installed: {sources})"
        )
    if record.get("flags") != NVCC_FLAGS:
        return f"it was built with other nvcc flags ({record.get('flags')})"
    try:
        data = (directory / CUBIN).read_bytes()
    except OSError as exc:
        return f"cannot read its cubin ({exc.strerror})"
    digest = hashlib.sha256(data).hexdigest()
    if digest != record.get(DIGEST) or digest != entry.get(DIGEST):
        return (
            f"the cubin ({len(data)} bytes) does not match its recorded SHA-256 (damaged or "
            "replaced)"
        )
    return ""


_opened: dict[tuple[str, int, int], KernelPack] = {}


def _open(root: Path) -> KernelPack:
    """The pack at `root`, read once per process (again if its manifest changes)."""
    stat = (root / MANIFEST).stat()
    key = (str(root.resolve()), stat.st_mtime_ns, stat.st_size)
    pack = _opened.get(key)
    if pack is None:
        pack = _opened[key] = KernelPack.open(root)
    return pack


def pack_folder(folder: Path) -> Path | None:
    """The folder holding the manifest: `folder` itself, or the package folder inside it."""
    for candidate in (folder, folder / PACKAGE):
        if (candidate / MANIFEST).is_file():
            return candidate
    return None


def find_pack() -> tuple[KernelPack | None, str]:
    """The kernel pack this process uses, or None and why there is none: $CUTE_AUTOTUNE_KERNELS
    when set, else the installed package (found without importing it)."""
    override = os.environ.get(ENV)
    if override:
        root = pack_folder(Path(override).expanduser())
        if root is None:
            return None, (
                f"${ENV}={override} holds no kernel pack (no {MANIFEST} in it or in "
                f"its {PACKAGE}/)"
            )
    else:
        spec = find_spec(PACKAGE)
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        root = next((Path(p) for p in locations if (Path(p) / MANIFEST).is_file()), None)
        if root is None:
            return None, f"no kernel pack is installed ({HOW_TO})"
    try:
        return _open(root), ""
    except (OSError, PackError) as exc:
        return None, str(exc)
