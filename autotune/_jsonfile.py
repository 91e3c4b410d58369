"""Read JSON that comes from outside (an import, a replayed recording, a config file) within
limits: a file is at most 256 MiB and nested at most 64 levels, and every way it can be wrong is
a JsonInputError whose message names the file, never an OSError, a RecursionError or a memory
blow-up from a hostile file. A file whose name ends in .gz is gzip-compressed JSON (the shipped
recordings); the limit applies to what it expands to, so a gzip bomb stops at 256 MiB."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

MAX_BYTES = 256 * 1024 * 1024
MAX_DEPTH = 64


class JsonInputError(ValueError):
    """JSON from outside that cannot be read; the message names where it came from."""


def read_json(path: str | Path) -> Any:
    """The document in the file `path`."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise JsonInputError(
                f"{path} is larger than {MAX_BYTES // 2**20} MiB "
                f"({size / 2**20:.0f} MiB); nothing was read"
            )
        raw = _read_gzip(path) if path.name.endswith(".gz") else path.read_bytes()
        text = raw.decode("utf-8")
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        raise JsonInputError(f"{path} is not a whole gzip file ({exc})") from None
    except OSError as exc:
        raise JsonInputError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise JsonInputError(f"{path} is not UTF-8 text ({exc.reason})") from None
    return loads_json(text, str(path))


def _read_gzip(path: Path) -> bytes:
    with gzip.open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise JsonInputError(
            f"{path} expands to more than {MAX_BYTES // 2**20} MiB; nothing was read"
        )
    return data


def loads_json(text: str, where: str) -> Any:
    """The document in `text` (from `where`, for messages)."""
    if len(text) > MAX_BYTES:
        raise JsonInputError(f"{where} is larger than {MAX_BYTES // 2**20} MiB")
    try:
        data = json.loads(text)
    except RecursionError:
        raise JsonInputError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise JsonInputError(f"{where}: not valid JSON ({exc})") from None
    if _depth(data) > MAX_DEPTH:
        raise JsonInputError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    return data


def _depth(data: Any) -> int:
    """Nesting depth of a parsed document (a scalar is 0), without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest
