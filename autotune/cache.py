"""Content-addressed store of compiled kernels.

Key: SHA-256 over the config's canonical JSON, the nvcc target, the kernel-source hash, the nvcc
and CUTLASS versions and the compile flags; change any of them and the artifact is rebuilt.
Layout: <cache>/cubins/<family>/<key>/{kernel.cubin, build.json, <name>.cu}. Entries are written
into a temporary directory and renamed into place, so readers never see half an entry and two
processes building the same key do not corrupt each other.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._paths import cache_dir
from .config import Config
from .toolchain import Toolchain

CUBIN = "kernel.cubin"
RECORD = "build.json"


def artifact_key(config: Config, gencode: str, source_hash: str, tools: Toolchain,
                 flags: list[str]) -> str:
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


class ArtifactCache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or cache_dir()) / "cubins"

    def path_for(self, family: str, key: str) -> Path:
        return self.root / family / key

    def get(self, family: str, key: str) -> CacheEntry | None:
        directory = self.path_for(family, key)
        try:
            record = json.loads((directory / RECORD).read_text())
        except (OSError, ValueError):
            return None
        if record.get("key") != key or not (directory / CUBIN).is_file():
            return None
        return CacheEntry(directory, record)

    def put(self, family: str, key: str, cubin: bytes, record: dict[str, Any],
            files: dict[str, str]) -> CacheEntry:
        final = self.path_for(family, key)
        final.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=final.parent))
        try:
            (staging / CUBIN).write_bytes(cubin)
            for name, text in files.items():
                (staging / name).write_text(text)
            (staging / RECORD).write_text(json.dumps(record, indent=1, sort_keys=True))
            if final.exists() and self.get(family, key) is None:
                shutil.rmtree(final, ignore_errors=True)  # a broken leftover entry
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
