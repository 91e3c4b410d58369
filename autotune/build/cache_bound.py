"""The cubin cache's bound: a size limit, the order entries are evicted in, and the removal of
what interrupted builds left behind.

The limit is `$CUTE_AUTOTUNE_CACHE_LIMIT` ("2G", "500M", "1.5GiB", a number of bytes, or "none"
for no limit) on the apparent size of the entries' files, 2 GiB by default. It is held after
each new entry (the compiler prunes after storing one) and by `cute-autotune cache prune`. Over
the limit, entries go in this order until the rest fit:
1. stale entries, oldest use first: built from other kernel sources, another nvcc or CUTLASS,
   other flags, or of a family this release does not have (their keys are never asked for
   again: every upgrade would otherwise add a full set), and entries whose record is unreadable;
2. then the least recently used (an entry's folder time, touched on each hit).
The entry just built is never evicted by its own build. Leftovers of interrupted builds (staging,
step-aside and work folders, `cache.ArtifactCache`) are removed whatever the size, as soon as
their owner is gone: a process of this host that no longer runs, or any owner after a day.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from ..model.space import all_families, load_space
from .cache import KEY, RECORD, WORK, ArtifactCache, owner_tag
from .toolchain import ToolchainError, family_source_hash, toolchain

LIMIT_ENV = "CUTE_AUTOTUNE_CACHE_LIMIT"
DEFAULT_LIMIT = 2 << 30
# a leftover whose owner cannot be asked (another host, a name without one) is gone after this
ORPHAN_AGE_S = 24 * 3600
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)
_OWNED = re.compile(r"(?:^|\.)([0-9a-f]{8})-(\d+)\.")  # `owner_tag()` inside a folder's name
_NO_LIMIT = ("none", "unlimited", "off")


def parse_size(text: str) -> int | None:
    """Bytes of a size written "2G", "500M", "1.5GiB", "1048576" (units are powers of 1024);
    None for "none". ValueError for anything else. (0 keeps only the entry just built.)"""
    if text.strip().lower() in _NO_LIMIT:
        return None
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(
            f"a cache size is a number with an optional unit K, M, G or T "
            f'("2G", "500M") or "none", got {text!r}'
        )
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def configured_limit() -> int | None:
    """The limit `$CUTE_AUTOTUNE_CACHE_LIMIT` sets, else the default."""
    text = os.environ.get(LIMIT_ENV)
    if not text:
        return DEFAULT_LIMIT
    try:
        return parse_size(text)
    except ValueError as exc:
        raise ValueError(f"{LIMIT_ENV}: {exc}") from None


@dataclass(frozen=True)
class CachedEntry:
    family: str
    key: str
    path: Path
    size: int  # bytes of its files
    used: float  # the last hit (or its making), seconds since the epoch
    stale: str  # why no current build asks for it ("" when one may)


@dataclass
class PruneReport:
    leftovers: list[Path] = field(default_factory=list)
    evicted: list[tuple[CachedEntry, str]] = field(default_factory=list)
    kept: list[CachedEntry] = field(default_factory=list)

    @property
    def kept_bytes(self) -> int:
        return sum(e.size for e in self.kept)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process, or a number no pid is: not ours to judge
    return True


def _abandoned(path: Path, now: float) -> bool:
    """Whether a temporary folder's owner is gone: a process of this host that no longer runs
    (its name says which), else any owner once the folder is a day old."""
    match = _OWNED.search(path.name)
    if match is not None and match.group(1) == owner_tag().split("-")[0]:
        return not _alive(int(match.group(2)))
    try:
        return now - path.lstat().st_mtime > ORPHAN_AGE_S
    except OSError:
        return False


def leftovers(cache: ArtifactCache) -> list[Path]:
    """The temporary folders of builds whose process is gone."""
    now = time.time()
    found: list[Path] = []
    for parent in (cache.root / WORK, *_family_dirs(cache)):
        try:
            children = list(os.scandir(parent))
        except OSError:
            continue
        for child in children:
            if (parent.name == WORK or child.name.startswith(".")) and _abandoned(
                Path(child.path), now
            ):
                found.append(Path(child.path))
    return found


def _family_dirs(cache: ArtifactCache) -> list[Path]:
    try:
        return [
            Path(d.path)
            for d in os.scandir(cache.root)
            if d.is_dir(follow_symlinks=False) and not d.name.startswith(".")
        ]
    except OSError:
        return []


def _current() -> tuple[dict[str, str], dict[str, str] | None]:
    """The kernel-source hash of each compiled family, and the toolchain's versions (None
    where no toolchain is found: then entries are judged by their sources and flags)."""
    sources = {}
    for name in all_families():
        space = load_space(name)
        if space.compiled:
            sources[name] = family_source_hash(space)
    try:
        tools = toolchain()
    except ToolchainError:
        return sources, None
    return sources, {"nvcc": tools.nvcc_version, "cutlass": tools.cutlass_version}


def _stale(
    family: str,
    directory: Path,
    sources: dict[str, str],
    tools: dict[str, str] | None,
    flags: list[str] | None,
) -> str:
    if family not in sources:
        return f"no family {family} in this release"
    try:
        record = json.loads((directory / RECORD).read_text())
        made = record["toolchain"]
        if not isinstance(made, dict):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError):
        return f"unreadable {RECORD}"
    if made.get("kernel_source") != sources[family]:
        return "built from other kernel sources"
    if tools is not None:
        for name in ("nvcc", "cutlass"):
            if made.get(name) != tools[name]:
                return f"built with {name} {made.get(name)} (now {tools[name]})"
    if flags is not None and record.get("flags") != flags:
        return "built with other nvcc flags"
    return ""


def survey(
    cache: ArtifactCache, *, judge: bool = True, flags: list[str] | None = None
) -> list[CachedEntry]:
    """Every entry of the cache, with its size and last use; `judge` reads each record to say
    whether it is stale against the current sources, toolchain and nvcc `flags` (else every
    entry's `stale` is "")."""
    sources, tools = _current() if judge else ({}, None)
    entries = []
    for family_dir in _family_dirs(cache):
        try:
            children = list(os.scandir(family_dir))
        except OSError:
            continue
        for child in children:
            if not KEY.fullmatch(child.name) or not child.is_dir(follow_symlinks=False):
                continue
            path = Path(child.path)
            try:
                size = sum(f.stat(follow_symlinks=False).st_size for f in os.scandir(path))
                used = child.stat(follow_symlinks=False).st_mtime
            except OSError:
                continue  # removed meanwhile
            stale = _stale(family_dir.name, path, sources, tools, flags) if judge else ""
            entries.append(CachedEntry(family_dir.name, child.name, path, size, used, stale))
    return entries


def prune(
    cache: ArtifactCache,
    limit: int | None,
    *,
    flags: list[str] | None = None,
    stale: bool = False,
    keep: Collection[Path] = (),
) -> PruneReport:
    """Remove leftovers, every stale entry when `stale`, then evict (stale first, then least
    recently used) until the entries fit `limit`; `keep` names entry folders never evicted;
    `flags` are the compiler's (an entry built with others is stale)."""
    report = PruneReport(leftovers=_remove_leftovers(cache))
    entries = survey(cache, judge=False)
    if not stale and (limit is None or sum(e.size for e in entries) <= limit):
        report.kept = entries
        return report
    entries = survey(cache, flags=flags)  # which are stale decides the order
    total = sum(e.size for e in entries)
    kept, gone = set(keep), set()
    for entry in sorted(
        (e for e in entries if e.path not in kept), key=lambda e: (not e.stale, e.used)
    ):  # stale first, then oldest use
        if not (limit is not None and total > limit) and not (stale and entry.stale):
            break
        cache.remove(entry.path)
        if entry.path.exists():
            continue  # a read-only cache: nothing could be removed
        total -= entry.size
        gone.add(entry.path)
        report.evicted.append((entry, entry.stale or "least recently used"))
    report.kept = [e for e in entries if e.path not in gone]
    return report


def _remove_leftovers(cache: ArtifactCache) -> list[Path]:
    removed = []
    for path in leftovers(cache):
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    return removed


def clear(cache: ArtifactCache, family: str | None = None) -> PruneReport:
    """Remove every entry (of `family` only, when given) and every leftover."""
    report = PruneReport(leftovers=_remove_leftovers(cache))
    for entry in survey(cache, judge=False):
        if family is not None and entry.family != family:
            report.kept.append(entry)
            continue
        cache.remove(entry.path)
        if entry.path.exists():
            report.kept.append(entry)
        else:
            report.evicted.append((entry, "cleared"))
    return report
