"""Plain-text tables for the CLI, as wide as the terminal (100 columns when the output is not a
terminal). A table that would be wider moves its widest columns out of the grid: each row is
followed by one indented `header: value` line per moved column, so a config name stays whole on
one line (to read, copy and grep) and prose is wrapped."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence

from .._shown import for_terminal

DEFAULT_WIDTH = 100  # when stdout is not a terminal (a pipe, a file, CI)
MIN_WIDTH = 60
GAP = "  "
DETAIL_INDENT = "    "


def output_width() -> int:
    """The terminal's width ($COLUMNS first), else DEFAULT_WIDTH; never below MIN_WIDTH."""
    return max(MIN_WIDTH, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)


def render_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    width: int | None = None,
    movable: Sequence[str] | None = None,
) -> str:
    """The table; `movable` names the columns that may leave the grid, in the order they
    should (default: every column but the first, widest first)."""
    width = width or output_width()
    # a cell may hold text from outside (a device name, a worker's message): escaped
    cells = [[for_terminal(str(c)) for c in row] for row in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    order = (
        [list(headers).index(name) for name in movable]
        if movable is not None
        else sorted(range(1, len(headers)), key=lambda i: -widths[i])
    )
    grid = list(range(len(headers)))
    moved: list[int] = []
    for column in order:
        if sum(widths[i] for i in grid) + len(GAP) * (len(grid) - 1) <= width:
            break
        grid.remove(column)
        moved.append(column)
    moved.sort()
    lines = [
        _line([cells[0][i] for i in grid], [widths[i] for i in grid]),
        GAP.join("-" * widths[i] for i in grid),
    ]
    for row in cells[1:]:
        lines.append(_line([row[i] for i in grid], [widths[i] for i in grid]))
        lines.extend(line for i in moved if row[i] for line in _detail(headers[i], row[i], width))
    return "\n".join(lines)


def _line(values: Sequence[str], widths: Sequence[int]) -> str:
    return GAP.join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()


def _detail(header: str, value: str, width: int) -> list[str]:
    """A moved cell: `header: value` under its row; prose wraps, a single word never breaks."""
    first = f"{DETAIL_INDENT}{header}: "
    return textwrap.wrap(
        value,
        width,
        initial_indent=first,
        subsequent_indent=DETAIL_INDENT + "  ",
        break_long_words=False,
        break_on_hyphens=False,
    ) or [first.rstrip()]
