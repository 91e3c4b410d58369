"""Content-addressed store of compiled kernels.

Key: SHA-256 over the config's canonical JSON, the nvcc target, the kernel-source hash, the nvcc
and CUTLASS versions and the compile flags; change any of them and the artifact is rebuilt.
Layout: <cache>/cubins/<family>/<key>/{kernel.cubin, build.json, <name>.cu}. Entries are written
into a temporary directory and renamed into place, so readers never see half an entry and two
processes building the same key do not corrupt each other.

Temporary folders carry their owner (`owner_tag`: this host and process) in their name: a staging
folder `.<key>.<owner>.*` beside the entries, a step-aside `.<key>.old.<owner>.*`, and the
folder nvcc builds in, `.work/<owner>.*`. A process killed mid-build leaves them, and the next
process to store an entry or prune the cache (`cache_bound`) removes those whose owner is gone.
An entry's folder time is touched on each hit: the cache's least recently used order.

Nothing is served unverified: `build.json` records the SHA-256 of the cubin, and an entry whose
record is unreadable or whose cubin does not match it (truncated, garbled, swapped) is a miss,
evicted and logged, so that the caller rebuilds it. A cache folder this process cannot write
still serves its entries; a build that would have to store one stops with CacheNotWritable
before nvcc runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._paths import cache_dir
from ..model.config import Config, check_family_name
from .toolchain import Toolchain

CUBIN = "kernel.cubin"
RECORD = "build.json"
DIGEST = "cubin_sha256"  # the record's field holding the SHA-256 of the cubin
KEY = re.compile(r"[0-9a-f]{16,64}")
WORK = ".work"  # under the cache root: the folders builds run nvcc in


def owner_tag() -> str:
    """This host and process, as temporary folder names carry them: `<host digest>-<pid>`."""
    host = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
    return f"{host}-{os.getpid()}"


log = logging.getLogger(__name__)


class CacheNotWritable(RuntimeError):
    """The cache folder cannot take a new entry; the message names it and the way out."""


def artifact_key(
    config: Config, gencode: str, source_hash: str, tools: Toolchain, flags: list[str]
) -> str:
    material = {
        "config": config.to_json(),
        "gencode": gencode,
        "kernel_source": source_hash,
        "nvcc": tools.nvcc_version,
        "cutlass": tools.cutlass_version,
        "flags": flags,
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class CacheEntry:
    directory: Path
    record: dict[str, Any]

    @property
    def cubin(self) -> Path:
        return self.directory / CUBIN


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ArtifactCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or cache_dir()) / "cubins"
        self._writable = False

    def path_for(self, family: str, key: str) -> Path:
        """The entry folder of (family, key); ValueError for anything that is not a family
        name and a hex key, so that no stored or imported string leads out of the cache."""
        try:
            check_family_name(family)
        except ValueError:
            raise ValueError(f"cache path refused: {family!r} is not a kernel family") from None
        if not isinstance(key, str) or not KEY.fullmatch(key):
            raise ValueError(f"cache path refused: {key!r} is not an artifact key")
        path = self.root / family / key
        if not path.resolve().is_relative_to(self.root.resolve()):
            raise ValueError(f"cache path refused: {path} is outside the cache {self.root}")
        return path

    def get(self, family: str, key: str) -> CacheEntry | None:
        """The verified entry of (family, key), or None: a damaged entry is evicted."""
        directory = self.path_for(family, key)
        if not directory.exists():
            return None
        try:
            record = json.loads((directory / RECORD).read_text())
        except (OSError, ValueError) as exc:
            self.evict(directory, f"unreadable {RECORD} ({exc})")
            return None
        why = self._damage(directory, key, record)
        if why:
            self.evict(directory, why)
            return None
        try:
            os.utime(directory)  # used now: the least recently used go first (cache_bound)
        except OSError:
            pass  # a read-only cache serves without keeping the order
        return CacheEntry(directory, record)

    @staticmethod
    def _damage(directory: Path, key: str, record: Any) -> str:
        """Why an entry cannot be served ("" when it can)."""
        if not isinstance(record, dict) or record.get("key") != key:
            return f"{RECORD} is not the record of {key}"
        if not isinstance(record.get(DIGEST), str):
            return f"{RECORD} has no {DIGEST}"
        try:
            data = (directory / CUBIN).read_bytes()
        except OSError as exc:
            return f"cannot read the cubin ({exc.strerror})"
        if _sha256(data) != record[DIGEST]:
            return f"the cubin ({len(data)} bytes) does not match its recorded SHA-256"
        return ""

    def evict(self, directory: Path, why: str) -> None:
        """Remove a damaged entry (logged); one in a read-only cache is only logged."""
        if not directory.resolve().is_relative_to(self.root.resolve()):
            raise ValueError(f"cache path refused: {directory} is outside the cache {self.root}")
        self.remove(directory)
        left = " (could not remove it: the cache is read-only)" if directory.exists() else ""
        log.warning("cubin cache: evicted damaged entry %s: %s%s", directory, why, left)

    def ensure_writable(self) -> None:
        """Raise CacheNotWritable unless a new entry can be stored (checked before a build, so
        that nvcc never runs for a result that could not be kept)."""
        if self._writable:
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.root):
                pass
        except OSError as exc:
            raise CacheNotWritable(
                f"the cubin cache {self.root.parent} is not writable ({exc.strerror}): set "
                "CUTE_AUTOTUNE_CACHE to a writable folder"
            ) from None
        self._writable = True

    @staticmethod
    def remove(final: Path) -> None:
        """Remove an entry by renaming it away first, so a reader never sees half of one (a
        read-only cache keeps it)."""
        try:
            old = Path(
                tempfile.mkdtemp(prefix=f".{final.name}.old.{owner_tag()}.", dir=final.parent)
            )
        except OSError:
            return
        try:
            os.rename(final, old / "entry")
        except OSError:
            pass
        shutil.rmtree(old, ignore_errors=True)

    @contextlib.contextmanager
    def work_dir(self) -> Iterator[Path]:
        """A folder to build in, removed afterwards; named for its owner, so that one a killed
        process left is removed by the next (`cache_bound.leftovers`)."""
        self.ensure_writable()
        parent = self.root / WORK
        parent.mkdir(exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix=f"{owner_tag()}.", dir=parent))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def put(
        self,
        family: str,
        key: str,
        cubin: bytes,
        record: dict[str, Any],
        files: dict[str, str],
        *,
        replace: bool = False,
    ) -> CacheEntry:
        """Store an entry (its record gains the cubin's SHA-256). An intact entry already there
        is kept (another process stored the same key first) unless `replace`."""
        self.ensure_writable()
        final = self.path_for(family, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.{owner_tag()}.", dir=final.parent))
        try:
            (staging / CUBIN).write_bytes(cubin)
            for name, text in files.items():
                (staging / name).write_text(text)
            (staging / RECORD).write_text(
                json.dumps({**record, DIGEST: _sha256(cubin)}, indent=1, sort_keys=True)
            )
            if replace:
                self.remove(final)
            elif final.exists():
                self.get(family, key)  # evicts a damaged leftover; an intact entry stays
            try:
                os.rename(staging, final)
            except OSError:
                # Another process stored the same key first; its entry is equivalent.
                shutil.rmtree(staging, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        entry = self.get(family, key)
        if entry is None:
            raise OSError(f"cache entry {final} could not be written")
        return entry
