"""`cute-autotune cache list | prune | clear`: the cubin cache's entries, its size limit
(build/cache_bound.py) and its cleaning."""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from typing import Any

from ..build.cache import ArtifactCache
from ..build.cache_bound import (
    LIMIT_ENV,
    CachedEntry,
    PruneReport,
    clear,
    configured_limit,
    leftovers,
    parse_size,
    prune,
    survey,
)
from ..build.compiler import NVCC_FLAGS
from .args import HelpFormatter
from .table import render_table


def size_text(size: int | None) -> str:
    if size is None:
        return "no limit"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def _age(seconds: float) -> str:
    for unit, scale in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= scale:
            return f"{seconds / scale:.0f} {unit} ago"
    return "just now"


def cmd_list(args: argparse.Namespace) -> int:
    cache = ArtifactCache()
    entries = survey(cache, flags=NVCC_FLAGS)
    left = leftovers(cache)
    limit = configured_limit()
    total = sum(e.size for e in entries)
    print(
        f"cubin cache {cache.root}: {len(entries)} entries, {size_text(total)} of "
        f"{size_text(limit)} ({LIMIT_ENV})"
    )
    if args.entries:
        now = time.time()
        rows = [
            [e.family, e.key, size_text(e.size), _age(now - e.used), e.stale or "current"]
            for e in sorted(entries, key=lambda e: (e.family, -e.used))
        ]
        if rows:
            print(render_table(["family", "key", "size", "last used", "state"], rows))
    else:
        by_family: dict[str, list[CachedEntry]] = defaultdict(list)
        for entry in entries:
            by_family[entry.family].append(entry)
        rows = []
        for family, group in sorted(by_family.items()):
            stale = [e for e in group if e.stale]
            rows.append(
                [
                    family,
                    str(len(group)),
                    size_text(sum(e.size for e in group)),
                    str(len(stale)),
                    size_text(sum(e.size for e in stale)),
                ]
            )
        if rows:
            print(render_table(["family", "entries", "size", "stale", "stale size"], rows))
    if left:
        print(f"{len(left)} folders of interrupted builds (removed by `cache prune`)")
    return 0


def _said(report: PruneReport, verb: str) -> None:
    for entry, why in report.evicted:
        print(f"{verb} {entry.family}/{entry.key} ({size_text(entry.size)}): {why}")
    freed = sum(entry.size for entry, _ in report.evicted)
    print(
        f"{verb} {len(report.evicted)} entries ({size_text(freed)}) and "
        f"{len(report.leftovers)} folders of interrupted builds; "
        f"{len(report.kept)} entries ({size_text(report.kept_bytes)}) kept"
    )


def cmd_prune(args: argparse.Namespace) -> int:
    limit = configured_limit() if args.limit is None else parse_size(args.limit)
    report = prune(ArtifactCache(), limit, flags=NVCC_FLAGS, stale=args.stale)
    _said(report, "evicted")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    report = clear(ArtifactCache(), args.family)
    _said(report, "removed")
    return 0 if not any(args.family in (None, e.family) for e in report.kept) else 1


def register(sub: Any) -> None:
    p = sub.add_parser("cache", help="the cubin cache: list, prune and clear its entries")
    actions = p.add_subparsers(dest="cache_command", required=True, help="what to do")
    p = actions.add_parser(
        "list",
        formatter_class=HelpFormatter,
        help="the entries by family, their size and how many are stale",
    )
    p.add_argument("--entries", action="store_true", help="one line per entry")
    p.set_defaults(func=cmd_list)
    p = actions.add_parser(
        "prune",
        formatter_class=HelpFormatter,
        help="remove what interrupted builds left, then evict entries (stale first, then the "
        "least recently used) until the cache fits its limit",
    )
    p.add_argument(
        "--limit", help=f"the size to fit, e.g. 2G or 500M (default: ${LIMIT_ENV}, else 2G)"
    )
    p.add_argument(
        "--stale",
        action="store_true",
        help="also evict every stale entry (built from other kernel sources, "
        "toolchain or flags), whatever the size",
    )
    p.set_defaults(func=cmd_prune)
    p = actions.add_parser(
        "clear", formatter_class=HelpFormatter, help="remove every entry (or one family's)"
    )
    p.add_argument("--family", help="only this kernel family's entries")
    p.set_defaults(func=cmd_clear)
