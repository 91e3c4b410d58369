"""A mapping that keeps its most recently used entries only: the runtime's memos (decisions,
launch plans, fallback counters) stay bounded however many distinct shapes a process meets."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LruDict(Generic[K, V]):
    """At most `maxsize` entries; setting one past that drops the least recently used (a hit
    of `get` or `in` counts as a use). A lookup on the hot path costs a dict lookup and a
    move to the end. Each operation is safe against another thread's (an entry dropped
    meanwhile is a miss, never an error); callers that must make a value once hold their own
    lock around the make."""

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be at least 1, got {maxsize}")
        self.maxsize = maxsize
        self._data: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K, default: V | None = None) -> V | None:
        try:
            value = self._data[key]
            self._data.move_to_end(key)
        except KeyError:
            return default
        return value

    def __contains__(self, key: object) -> bool:
        try:
            self._data.move_to_end(key)  # type: ignore[arg-type]
        except KeyError:
            return False
        return True

    def __getitem__(self, key: K) -> V:
        value = self._data[key]
        try:
            self._data.move_to_end(key)
        except KeyError:
            pass
        return value

    def __setitem__(self, key: K, value: V) -> None:
        self._data[key] = value
        try:
            self._data.move_to_end(key)
        except KeyError:
            pass
        while len(self._data) > self.maxsize:
            try:
                self._data.popitem(last=False)
            except KeyError:
                break

    def setdefault(self, key: K, value: V) -> V:
        """The value of `key`, set to `value` first where there is none."""
        found = self.get(key)
        if found is None:
            self[key] = value
            return value
        return found

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        self._data.clear()

    def values(self) -> list[V]:
        return list(self._data.values())
