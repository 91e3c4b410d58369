"""Build (once per machine) and import the pybind11 launcher extension.

The extension is compiled from kernel_src/launcher/launcher.cpp with the host C++ compiler into
<cache>/launcher/<hash>/, where the hash covers its sources, the Python ABI, the pybind11 version
and the compiler. A file lock keeps concurrent processes from building it twice.

A machine without a C++ compiler or the toolkit's cuda.h imports the one a kernel pack carries
(build/pack.py) instead, if it was built for this Python ABI (`abi_tag`). The extension opens
the CUDA driver itself at run time, so it needs no toolkit library where it is imported.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from pathlib import Path
from types import ModuleType

from .._paths import cache_dir, kernel_src_dir
from ..build.pack import LauncherFile, find_pack
from ..build.toolchain import ToolchainError, find_cuda_include

MODULE_NAME = "_cute_autotune_launcher"


class LauncherBuildError(RuntimeError):
    pass


def _sources() -> list[Path]:
    root = kernel_src_dir()
    return [
        root / "launcher" / "launcher.cpp",
        root / "fwd_params.h",
        root / "common" / "launch_info.h",
        root / "common" / "tma_params.h",
        root / "launcher" / "cluster_combine.h",
        root / "bwd" / "params.h",
    ]


def _compiler() -> str:
    for candidate in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate) or candidate
    raise ToolchainError("no C++ compiler found to build the launcher (set CXX)")


def _build_key(compiler: str) -> str:
    import pybind11

    digest = hashlib.sha256()
    for path in _sources():
        digest.update(path.read_bytes())
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    digest.update(f"{suffix}|{pybind11.__version__}|{compiler}|{sys.version}".encode())
    return digest.hexdigest()[:16]


def _abi() -> tuple[str, str]:
    """The Python ABI an extension is built for (its suffix names the interpreter, its version
    and the platform) and the pybind11 version it is built with."""
    import pybind11

    return importlib.machinery.EXTENSION_SUFFIXES[0], str(pybind11.__version__)


def abi_tag() -> str:
    """What a prebuilt extension must have been built for to be imported here: the launcher's
    sources, the extension suffix and pybind11's version. Unlike the build key, it leaves out the
    compiler and the exact Python build: an extension of the same suffix loads under any."""
    return _tag(*_abi())


def _tag(suffix: str, pybind: str) -> str:
    digest = hashlib.sha256()
    for path in _sources():
        digest.update(path.read_bytes())
    digest.update(f"{suffix}|{pybind}".encode())
    return digest.hexdigest()[:16]


def build_launcher(force: bool = False) -> Path:
    """Path of the built extension, building it if needed; ToolchainError when this machine
    has no C++ compiler or no cuda.h to build it with."""
    import pybind11

    compiler = _compiler()
    directory = cache_dir() / "launcher" / _build_key(compiler)
    target = directory / (MODULE_NAME + importlib.machinery.EXTENSION_SUFFIXES[0])
    if target.is_file() and not force:
        return target
    cuda_include = find_cuda_include()  # only a build needs it: one built earlier is kept
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock_file = open(directory / ".lock", "w")  # noqa: SIM115 - held for the build below
    except OSError as exc:
        raise LauncherBuildError(
            f"cannot build the launcher in {directory} ({exc.strerror}): set "
            "CUTE_AUTOTUNE_CACHE to a writable folder"
        ) from None
    with lock_file as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file() and not force:
            return target
        staging = directory / f"{target.name}.{os.getpid()}.tmp"
        command = [
            compiler,
            "-O2",
            "-std=c++17",
            "-shared",
            "-fPIC",
            "-fvisibility=hidden",
            f"-I{pybind11.get_include()}",
            f"-I{sysconfig.get_paths()['include']}",
            f"-I{cuda_include}",
            str(_sources()[0]),
            "-o",
            str(staging),
            "-ldl",
        ]
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            raise LauncherBuildError(
                "building the launcher extension failed:\n"
                + " ".join(command)
                + "\n"
                + proc.stderr[-4000:]
            )
        staging.replace(target)
    return target


_module: ModuleType | None = None
_module_lock = threading.Lock()


def launcher() -> ModuleType:
    """The imported launcher extension (built on first use; once per process, whichever
    thread asks first)."""
    global _module
    with _module_lock:
        if _module is None:
            _module = import_launcher()
        return _module


def launcher_path() -> Path:
    """The extension this process imports: built here from source when a C++ compiler and
    cuda.h are at hand (as always), else the kernel pack's, built for this Python ABI."""
    try:
        return build_launcher()
    except ToolchainError as missing:
        pack, why = find_pack()
        if pack is not None:
            path, why = pack.launcher(abi_tag())
            if path is not None:
                return path
        suffix, pybind = _abi()
        raise ToolchainError(
            f"cannot build the launcher extension ({missing}), and there is no prebuilt one for "
            f"this Python ({suffix}, pybind11 {pybind}): {why}"
        ) from None


def prebuilt_launcher() -> LauncherFile:
    """The extension built here (building it if needed), described for a kernel pack."""
    suffix, pybind = _abi()
    return LauncherFile(abi_tag(), suffix, pybind, build_launcher())


def import_launcher() -> ModuleType:
    """Build (if needed) and import the extension, without the per-process memo."""
    path = launcher_path()
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise LauncherBuildError(f"cannot import the launcher from {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:  # a prebuilt one made for another C library, say
        raise LauncherBuildError(f"cannot import the launcher {path}: {exc}") from None
    return module
