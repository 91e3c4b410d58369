"""A kernel configuration: a frozen value with a canonical JSON form and a stable digest."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from .._shown import shown

Value = int | bool | str

# A kernel family is the stem of one of the package's space files (search_spaces/<family>.toml).
# The name is checked wherever a config is made, so that no string read from a database, an
# import or the command line can reach a path as anything but a plain name.
FAMILY_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


def check_family_name(family: object) -> str:
    """`family` if it is a well-formed family name; InvalidConfig otherwise."""
    if not isinstance(family, str) or not FAMILY_NAME.fullmatch(family):
        raise InvalidConfig(
            [
                f"unknown kernel family {shown(family)}: a family is named by a "
                "space file (lower-case letters, digits and _, at most 32)"
            ]
        )
    return family


class InvalidConfig(ValueError):
    """A config that does not belong to its family's space; `reasons` says why, one per line."""

    def __init__(self, reasons: list[str], config: object = None) -> None:
        self.reasons = list(reasons)
        self.config = config
        super().__init__("; ".join(self.reasons))


@dataclass(frozen=True, eq=False)
class Config:
    """The template parameters of one kernel instance of one family.

    Only the structure is checked here (a family name, scalar values). Whether the values are
    allowed is the family's Space's business: `Space.validate` checks a config read from outside
    once and makes it a `ValidConfig` (model/space.py), the value build and codegen work on.
    """

    family: str
    values: tuple[tuple[str, Value], ...]

    def __post_init__(self) -> None:
        check_family_name(self.family)

    @classmethod
    def make(cls, family: str, values: Mapping[str, Value]) -> Config:
        for name, value in values.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise InvalidConfig([f"parameter name {shown(name)} is not an identifier"])
            if not isinstance(value, (bool, int, str)):
                raise InvalidConfig([f"{name} = {shown(value)}: values must be int, bool or str"])
        return cls(family, tuple(sorted(values.items())))

    @classmethod
    def from_dict(cls, data: object) -> Config:
        """Inverse of `as_dict`: {"family": ..., <param>: <value>, ...}."""
        if not isinstance(data, Mapping):
            raise InvalidConfig([f"a config must be a JSON object, not {type(data).__name__}"])
        family = data.get("family")
        if not isinstance(family, str) or not family:
            raise InvalidConfig(["a config needs a 'family' string"])
        return cls.make(
            check_family_name(family), {k: v for k, v in data.items() if k != "family"}
        )

    @classmethod
    def from_json(cls, text: str) -> Config:
        try:
            data = json.loads(text)
        except (ValueError, TypeError) as exc:  # JSONDecodeError, bytes not UTF-8, not text
            raise InvalidConfig([f"not valid JSON: {exc}"]) from None
        return cls.from_dict(data)

    # Identity is the canonical JSON: in Python `0 == False`, but a config with q_in_regs=0 is a
    # different (and invalid) config from one with q_in_regs=false, and has another digest.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __lt__(self, other: Config) -> bool:
        return self.to_json() < other.to_json()

    def __getitem__(self, name: str) -> Value:
        for key, value in self.values:
            if key == name:
                return value
        raise KeyError(f"{self.family} config has no parameter {shown(name)}")

    def __iter__(self) -> Iterator[tuple[str, Value]]:
        return iter(self.values)

    def as_dict(self) -> dict[str, Value]:
        return {"family": self.family, **dict(self.values)}

    def replace(self, **changes: Value) -> Config:
        return Config.make(self.family, {**dict(self.values), **changes})

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, no whitespace. Equal configs give equal bytes."""
        return json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def digest(self) -> str:
        """First 16 hex digits of the SHA-256 of the canonical JSON."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]
