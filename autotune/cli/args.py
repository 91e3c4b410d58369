"""Argument types and help formatting shared by every command: numbers are checked as argparse
reads them, so a bad value is one line naming the flag and exit status 2 before anything runs."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _number(
    kind: type[int] | type[float], low: float, inclusive: bool, what: str
) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        if value < low or (value == low and not inclusive):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    parse.__name__ = what  # argparse names the type in its messages
    return parse


positive_int = _number(int, 1, True, "an integer >= 1")
nonnegative_int = _number(int, 0, True, "an integer >= 0")
positive_float = _number(float, 0.0, False, "a number > 0")


def database_argument(text: str) -> str:
    """`--db` as given (a URL or the path of a SQLite file), unless it is a SQLite file whose
    folder does not exist: nothing is created silently where a path was mistyped."""
    from pathlib import Path

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from ..store.schema import database_url, sqlite_path

    try:
        path = sqlite_path(make_url(database_url(text)))
    except ArgumentError:
        return text  # not a URL: the store says so when it opens it
    if path is not None and not path.parent.is_dir():
        folder = Path(path.parent)
        raise argparse.ArgumentTypeError(
            f"the folder {folder} of the database file {path.name} does not exist (nothing is "
            f"created there): make it first, or name a file in an existing folder"
        )
    return text


database_argument.__name__ = "a database URL or SQLite file"


def add_database(p: argparse.ArgumentParser) -> None:
    """`--db` in one form on every command that reads or writes the tuning database."""
    p.add_argument(
        "--db",
        type=database_argument,
        help="the tuning database: a SQLAlchemy URL or the path of a SQLite file "
        "(default: $CUTE_AUTOTUNE_DB, else a SQLite file in the cache directory)",
    )


MASKS = ("false", "true", "both")


def add_causal(p: argparse.ArgumentParser, *, default: str | None, both: bool, help: str) -> None:
    """`--causal` in one form on every command: `--causal` alone means true, `--causal false`
    and `--causal true` say it outright, and where a command covers several problems (a shape
    set, a piece of a space) `--causal both` keeps either mask."""
    choices = MASKS if both else MASKS[:2]
    p.add_argument(
        "--causal",
        nargs="?",
        const="true",
        default=default,
        choices=choices,
        metavar="{" + ",".join(choices) + "}",
        help=f"{help}; `--causal` alone: true",
    )


class HelpFormatter(argparse.HelpFormatter):
    """Help that shows each flag's default where it has one (not None, not a switch's False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            default not in (None, False, argparse.SUPPRESS)
            and "%(default)" not in text
            and "default" not in text
            and action.option_strings
        ):
            text += " (default: %(default)s)"
        return text
