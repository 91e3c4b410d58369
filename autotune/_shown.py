"""Values from outside (a file, a database row, a call's argument) in what is printed.

`shown`: a value in a message, one line, bounded, escaped (`repr` escapes control characters
and newlines in text; an integer too long to print, 10^400 or past Python's 4,300-digit limit,
is described by its size). `for_terminal`: text printed as it is (a device name in a table),
with every character a terminal would act on written as its escape."""

from __future__ import annotations

LIMIT = 40


def shown(value: object, limit: int = LIMIT) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > 128:
        digits = int(abs(value).bit_length() * 0.30103) + 1
        return f"{'-' if value < 0 else ''}an integer of about {digits} digits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def for_terminal(text: str) -> str:
    """`text` with each character that `str.isprintable` refuses (control characters: escape
    sequences that clear or move the screen, newlines and carriage returns that forge a line;
    invisible format characters such as bidirectional overrides) written as its Python
    escape, `\\x1b`, `\\n`, `\\u202e`."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )
