"""The test run's memo of nvcc builds (tests/nvcc_memo.py): a build made before is answered
from the memo, with the same output, report and exit status; another source, another flag or
a changed kernel header is built again; anything but a build goes to the real nvcc."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MEMO = Path(__file__).resolve().parents[1] / "nvcc_memo.py"
FAKE = """#!/bin/sh
# counts its runs; "builds" by copying the source to -o, or fails on a source saying FAIL
echo run >> "{runs}"
if [ "$1" = "--version" ]; then echo "release 13.0"; exit 0; fi
while [ "$1" != "-o" ]; do shift; done
if grep -q FAIL "$3"; then echo "error: static assertion failed" >&2; exit 2; fi
cp "$3" "$2"; echo "ptxas info : Used 100 registers" >&2
"""


def _setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    runs = tmp_path / "runs"
    fake = tmp_path / "nvcc"
    fake.write_text(FAKE.format(runs=runs))
    fake.chmod(0o755)
    headers = tmp_path / "kernel_src"
    headers.mkdir()
    (headers / "fwd_params.h").write_text("// v1\n")
    return fake, runs, headers


def _build(
    fake: Path, memo: Path, headers: Path, source: Path, flag: str = "-O3"
) -> subprocess.CompletedProcess[str]:
    out = source.with_suffix(".cubin")
    out.unlink(missing_ok=True)
    return subprocess.run(
        [
            sys.executable,
            str(MEMO),
            str(fake),
            str(memo),
            flag,
            f"-I{headers}",
            "-o",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
    )


def _runs(runs: Path) -> int:
    return len(runs.read_text().splitlines()) if runs.exists() else 0


def test_a_build_made_before_is_answered_from_the_memo(tmp_path: Path) -> None:
    fake, runs, headers = _setup(tmp_path)
    memo = tmp_path / "memo"
    source = tmp_path / "a.cu"
    source.write_text("kernel a\n")
    first = _build(fake, memo, headers, source)
    again = _build(fake, memo, headers, source)
    assert _runs(runs) == 1
    for done in (first, again):
        assert done.returncode == 0 and "Used 100 registers" in done.stderr
        assert source.with_suffix(".cubin").read_text() == "kernel a\n"
    _build(fake, memo, headers, source, flag="-O2")  # another flag
    other = tmp_path / "b.cu"
    other.write_text("kernel b\n")
    _build(fake, memo, headers, other)  # another source
    (headers / "fwd_params.h").write_text("// v2\n")
    _build(fake, memo, headers, source)  # a changed header
    assert _runs(runs) == 4


def test_a_failed_build_fails_again_and_anything_else_goes_through(tmp_path: Path) -> None:
    fake, runs, headers = _setup(tmp_path)
    memo = tmp_path / "memo"
    source = tmp_path / "bad.cu"
    source.write_text("FAIL\n")
    for _ in range(2):
        done = _build(fake, memo, headers, source)
        assert done.returncode == 2 and "static assertion" in done.stderr
        assert not source.with_suffix(".cubin").exists()
    assert _runs(runs) == 1
    for _ in range(2):
        version = subprocess.run(
            [sys.executable, str(MEMO), str(fake), str(memo), "--version"],
            capture_output=True,
            text=True,
        )
        assert version.returncode == 0 and "release 13.0" in version.stdout
    assert _runs(runs) == 3
