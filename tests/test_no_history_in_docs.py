"""Docs say what is and why; history lives in CHANGELOG.md and git. README.md, docs/ (outside
fenced blocks, which hold command output) and the package's sources (Python, kernels, shape
sets) carry no dates, no session or stop numbers and no issue numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HISTORY = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b[Ss]ession \d+|\b[Ss]top \d+|\b[Ii]ssue \d+")
SOURCES = [
    p
    for folder in ("autotune", "kernel_src", "search_spaces")
    for p in sorted((REPO / folder).rglob("*"))
    if p.suffix in {".py", ".h", ".cuh", ".cu", ".cpp", ".toml"}
]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside ``` fences."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append((number, line))
    return lines


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_docs_carry_no_history(path: Path) -> None:
    found = [
        f"{n}: {line.strip()}" for n, line in _prose(path.read_text()) if HISTORY.search(line)
    ]
    assert not found, found


def test_sources_carry_no_history() -> None:
    assert SOURCES, "no sources found"
    found = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for p in SOURCES
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not found, found


def test_the_check_finds_history() -> None:
    """The pattern catches each kind it is for, and fenced output is left alone."""
    for line in ("measured 2026-12-03", "since session 5", "stop 53's run", "issue 15 asks"):
        assert HISTORY.search(line), line
    assert _prose("a\n```\n2026-12-01 05:24:37\n```\nb") == [(1, "a"), (5, "b")]
