"""A value from outside (a file, a database row, a call's argument) shown in a message: one
line, bounded, escaped. `repr` escapes control characters and newlines in text; an integer
too long to print (10^400, or past Python's 4,300-digit limit) is described by its size."""

from __future__ import annotations

LIMIT = 40


def shown(value: object, limit: int = LIMIT) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > 128:
        digits = int(abs(value).bit_length() * 0.30103) + 1
        return f"{'-' if value < 0 else ''}an integer of about {digits} digits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."
