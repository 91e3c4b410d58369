"""The build toolchain: nvcc, the CUTLASS/CuTe headers and the kernel sources, with the version
strings that go into every artifact's cache key.

Everything here is memoised, and nvcc's version is also remembered on disk (keyed by the
binary's path, size and mtime), so that a cache hit in a fresh process runs no subprocess.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .._paths import cache_dir, kernel_src_dir
from ..model.space import Space


class ToolchainError(RuntimeError):
    """nvcc or the CUTLASS headers cannot be found; the message says how to fix it."""


@dataclass(frozen=True)
class Toolchain:
    nvcc: Path
    nvcc_version: str  # e.g. "13.0.88"
    cutlass_include: Path
    cutlass_version: str  # e.g. "4.2.0"

    @property
    def cuda_include(self) -> Path:
        """The toolkit's include/ (cuda.h), for the host-side launcher build."""
        return find_cuda_include(self.nvcc)


def find_cuda_include(nvcc: Path | None = None) -> Path:
    """The include/ folder holding cuda.h, for the host-side launcher build. It needs only the
    header, not nvcc: `nvcc` (else the one `find_nvcc` finds, if any) is one place it looks."""
    candidates = [
        Path(os.environ[v]) / "include" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)
    ]
    if nvcc is None:
        try:
            nvcc = find_nvcc()
        except ToolchainError:
            pass
    if nvcc is not None:
        candidates.append(nvcc.parent.parent / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    for c in candidates:
        if (c / "cuda.h").is_file():
            return c
    raise ToolchainError("cuda.h not found: set CUDA_HOME to the CUDA toolkit")


def find_nvcc() -> Path:
    candidates = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "bin" / "nvcc")
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c.resolve()
    raise ToolchainError(
        "nvcc not found: install the CUDA toolkit and put nvcc on PATH, or set CUDA_HOME"
    )


def nvcc_version(nvcc: Path) -> str:
    stat = nvcc.stat()
    key = f"{nvcc}:{stat.st_size}:{stat.st_mtime_ns}"
    memo = cache_dir() / "toolchain.json"
    try:
        known = json.loads(memo.read_text())
        if known.get(key):
            return str(known[key])
    except (OSError, ValueError):
        known = {}
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, check=True)
    match = re.search(r"release [\d.]+, V([\d.]+)", out.stdout)
    if not match:
        raise ToolchainError(f"cannot read the version from `{nvcc} --version`:\n{out.stdout}")
    version = match.group(1)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**known, key: version}))
        tmp.replace(memo)
    except OSError:
        pass  # the memo only saves a subprocess; failing to write it is harmless
    return version


def find_cutlass_include() -> Path:
    """$CUTLASS_INCLUDE, else the headers inside the nvidia-cutlass wheel (not imported)."""
    override = os.environ.get("CUTLASS_INCLUDE")
    if override:
        path = Path(override).expanduser()
        if not (path / "cute" / "tensor.hpp").is_file():
            raise ToolchainError(f"CUTLASS_INCLUDE={override} has no cute/tensor.hpp")
        return path.resolve()
    # find_spec locates the package without executing its __init__ (which imports a lot).
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        raise ToolchainError(
            "CUTLASS headers not found: `pip install nvidia-cutlass==4.2.0.0`, or set "
            "CUTLASS_INCLUDE to a CUTLASS include/ directory"
        )
    for location in spec.submodule_search_locations:
        include = Path(location) / "source" / "include"
        if (include / "cute" / "tensor.hpp").is_file():
            return include.resolve()
    raise ToolchainError("the nvidia-cutlass package has no source/include/cute; reinstall it")


def cutlass_version(include: Path) -> str:
    text = (include / "cutlass" / "version.h").read_text()
    parts = [re.search(rf"#define CUTLASS_{p}\s+(\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise ToolchainError(f"cannot read the CUTLASS version from {include}/cutlass/version.h")
    return ".".join(m.group(1) for m in parts if m)


_SOURCE_SUFFIXES = {".h", ".hpp", ".cuh", ".cu"}


@cache
def kernel_source_hash(family_dir: str, *included_dirs: str) -> str:
    """SHA-256 over the device sources a family's cubins are built from: the shared headers at
    the top of kernel_src/, the collectives every family includes (kernel_src/common/), the
    family's own directory and the other families' directories it includes (path and bytes,
    stable order). The launcher's sources are not part of it: rebuilding the launcher keeps
    every cubin."""
    root = kernel_src_dir()
    files = [p for p in root.glob("*") if p.is_file()]
    for folder in dict.fromkeys(("common", family_dir, *included_dirs)):
        files += [p for p in (root / folder).rglob("*") if p.is_file()]
    digest = hashlib.sha256()
    for path in sorted(f for f in files if f.suffix in _SOURCE_SUFFIXES):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def family_source_hash(space: Space) -> str:
    """Hash of the device sources `space`'s kernels are built from ("" for torch's family)."""
    if not space.compiled:
        return ""
    return kernel_source_hash(Path(space.header).parts[0], *space.sources)


@cache
def toolchain() -> Toolchain:
    nvcc = find_nvcc()
    include = find_cutlass_include()
    return Toolchain(nvcc, nvcc_version(nvcc), include, cutlass_version(include))
