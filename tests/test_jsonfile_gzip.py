"""Compressed JSON (the shipped recordings are .json.gz): read like plain JSON, and a broken or
oversized one is one clear error naming the file."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from autotune import _jsonfile
from autotune._jsonfile import JsonInputError, read_json


def test_a_gzip_file_reads_like_the_plain_one(tmp_path: Path) -> None:
    doc = {"shapes": [{"a": 1}], "name": "x"}
    plain, packed = tmp_path / "r.json", tmp_path / "r.json.gz"
    plain.write_text('{"shapes": [{"a": 1}], "name": "x"}')
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_json(plain) == read_json(packed) == doc


@pytest.mark.parametrize(
    "content",
    [b"not gzip at all", gzip.compress(b'{"a": 1}', mtime=0)[:-9]],
    ids=["not-gzip", "truncated"],
)
def test_a_broken_gzip_file_is_refused_by_name(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "broken.json.gz"
    path.write_bytes(content)
    with pytest.raises(JsonInputError, match=r"broken\.json\.gz is not a whole gzip file"):
        read_json(path)


def test_a_gzip_bomb_stops_at_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_jsonfile, "MAX_BYTES", 1000)
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(gzip.compress(b" " * 100_000))  # 100 kB from a file of about 130 bytes
    assert path.stat().st_size < 1000
    with pytest.raises(JsonInputError, match="expands to more than"):
        read_json(path)
