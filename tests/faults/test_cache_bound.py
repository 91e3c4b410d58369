"""A bounded cubin cache (issue 37, item 7): a size limit held after every build, stale entries
(other kernel sources, toolchain or flags) evicted before the least recently used, the entry
just built kept, `cute-autotune cache list | prune | clear`, and nothing left behind by a
build killed mid-way.

Before: the cache only grew (every toolchain or kernel-source change added a full set), there
was no command to see or clean it, and a build killed while nvcc ran left its folder in the
system's temporary directory for good.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from autotune.build import compiler
from autotune.build.cache import WORK, ArtifactCache, owner_tag
from autotune.build.cache_bound import (
    LIMIT_ENV,
    configured_limit,
    leftovers,
    parse_size,
    prune,
    survey,
)
from autotune.build.compiler import NVCC_FLAGS, compile_config
from autotune.build.toolchain import family_source_hash, toolchain
from autotune.cli.main import main
from autotune.model.space import load_space
from autotune.model.target import target_for_arch

from .conftest import read_only, sm80_config

H200 = target_for_arch(90)
KB = 1024


def _made_with(stale: str = "") -> dict[str, Any]:
    """The `toolchain` of a record: the current one, or one `stale` names as changed."""
    tools = toolchain()
    made = {
        "nvcc": tools.nvcc_version,
        "cutlass": tools.cutlass_version,
        "kernel_source": family_source_hash(load_space("sm80")),
    }
    if stale:
        made[stale] = "0.0"  # another release
    return made


def _put(
    cache: ArtifactCache, name: str, size: int, *, stale: str = "", used: float | None = None
) -> Path:
    """An entry of `size` bytes of cubin (not a kernel: the bound reads sizes and records)."""
    key = hashlib.sha256(name.encode()).hexdigest()[:32]
    record = {"key": key, "toolchain": _made_with(stale), "flags": NVCC_FLAGS}
    entry = cache.put("sm80", key, os.urandom(size), record, {})
    if used is not None:
        os.utime(entry.directory, (used, used))
    return entry.directory


@pytest.fixture
def cache(cache_root: Path) -> ArtifactCache:
    return ArtifactCache(cache_root)


# the toolchain's versions are what a current entry is built with
pytestmark = pytest.mark.nvcc


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("2G", 2 << 30),
        ("500M", 500 << 20),
        ("1.5GiB", 3 << 29),
        ("64kb", 64 * KB),
        ("1048576", 1 << 20),
        ("0", 0),
        ("none", None),
    ],
)
def test_sizes_are_read_in_powers_of_1024(text: str, size: int | None) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "-1G", "2X", "G", "1e9", "2 G B"])
def test_a_size_that_is_not_one_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="a cache size is"):
        parse_size(text)


def test_the_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    assert configured_limit() == 2 << 30
    monkeypatch.setenv(LIMIT_ENV, "100M")
    assert configured_limit() == 100 << 20
    monkeypatch.setenv(LIMIT_ENV, "lots")
    with pytest.raises(ValueError, match=LIMIT_ENV):
        configured_limit()


def test_stale_entries_go_before_the_least_recently_used(
    cache: ArtifactCache, fault_summary: Callable[[dict[str, Any]], None]
) -> None:
    now = time.time()
    current = [_put(cache, f"current {i}", 100 * KB, used=now - 3600 * (5 - i)) for i in range(3)]
    stale = [
        _put(cache, f"stale {what}", 100 * KB, stale=what, used=now)
        for what in ("kernel_source", "nvcc", "cutlass")
    ]
    report = prune(cache, 350 * KB, flags=NVCC_FLAGS)
    evicted = {entry.path: why for entry, why in report.evicted}
    fault_summary(
        {
            "case": "cubin cache over its limit: 3 stale entries used last, 3 current",
            "evicted": sorted(evicted.values()),
        }
    )
    assert set(evicted) == set(stale), evicted
    assert "built from other kernel sources" in evicted.values()
    assert all(path.exists() for path in current)
    # and then the least recently used: a hit makes the oldest the newest
    assert compiler.ArtifactCache(cache.root.parent).get("sm80", current[0].name) is not None
    report = prune(cache, 250 * KB, flags=NVCC_FLAGS)
    assert [entry.path for entry, _ in report.evicted] == [current[1]]
    assert [why for _, why in report.evicted] == ["least recently used"]


def test_prune_stale_evicts_every_stale_entry_whatever_the_size(cache: ArtifactCache) -> None:
    keep = _put(cache, "current", 10 * KB)
    old = _put(cache, "old flags", 10 * KB)
    record_path = old / "build.json"
    record = json.loads(record_path.read_text())
    record["flags"] = ["-O1"]
    record_path.write_text(json.dumps(record))
    unreadable = _put(cache, "unreadable", 10 * KB)
    (unreadable / "build.json").write_text("{")
    report = prune(cache, None, flags=NVCC_FLAGS, stale=True)
    assert {entry.path: why for entry, why in report.evicted} == {
        old: "built with other nvcc flags",
        unreadable: "unreadable build.json",
    }
    assert keep.exists()


def test_the_entry_just_built_is_kept_even_alone_over_the_limit(cache: ArtifactCache) -> None:
    older = _put(cache, "older", 10 * KB, stale="nvcc")
    new = _put(cache, "new", 200 * KB)
    report = prune(cache, 0, keep=[new])
    assert [entry.path for entry, _ in report.evicted] == [older]
    assert new.exists()


class _ReplayedNvcc:
    """The compiler's subprocess: the first build runs the real nvcc and is recorded; later
    builds replay its cubin and ptxas report in their own output (fast, and each is a new
    entry under its own key)."""

    def __init__(self) -> None:
        self.recorded: tuple[bytes, str] | None = None
        self.TimeoutExpired = subprocess.TimeoutExpired
        self.runs = 0

    def run(self, command: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        self.runs += 1
        out = Path(command[command.index("-o") + 1])
        if self.recorded is None:
            done = subprocess.run(command, **kwargs)
            if done.returncode == 0:
                self.recorded = (out.read_bytes(), done.stderr)
            return done
        out.write_bytes(self.recorded[0])
        return subprocess.CompletedProcess(command, 0, "", self.recorded[1])


def test_the_limit_holds_under_a_build_loop(
    cache: ArtifactCache,
    monkeypatch: pytest.MonkeyPatch,
    fault_summary: Callable[[dict[str, Any]], None],
) -> None:
    replay = _ReplayedNvcc()
    monkeypatch.setattr(
        compiler,
        "subprocess",
        types.SimpleNamespace(run=replay.run, TimeoutExpired=subprocess.TimeoutExpired),
    )
    monkeypatch.setenv(LIMIT_ENV, "200K")
    configs = load_space("sm80").valid_configs(
        H200, {"head_dim": 64, "dtype": "fp16", "causal": False}
    )[:12]
    assert len(configs) == 12
    sizes, built = [], []
    for config in configs:
        build = compile_config(config, H200, cache)
        assert build.ok, build.message
        built.append(build.cubin.parent)  # type: ignore[union-attr]
        sizes.append(sum(e.size for e in survey(cache, judge=False)))
    entry = sum(f.stat().st_size for f in built[-1].iterdir())
    fault_summary(
        {
            "case": "cubin cache limit 200K held under a loop of 12 builds",
            "entry_bytes": entry,
            "total_after_each_build": sizes,
        }
    )
    assert replay.runs == len(configs)
    assert max(sizes) <= 200 * KB + entry, sizes  # the limit, or the one entry just built
    assert built[-1].exists()
    assert not any(cache.root.joinpath(WORK).iterdir())


FAKE_NVCC = textwrap.dedent("""\
    #!/bin/sh
    # nvcc's version from the real one; a build that runs until it is killed
    if [ "$1" = "--version" ]; then exec "{real}" --version; fi
    sleep 600
""")


def test_a_build_killed_mid_way_leaves_nothing_behind(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault_summary: Callable[[dict[str, Any]], None],
) -> None:
    fake = tmp_path / "cuda" / "bin" / "nvcc"
    fake.parent.mkdir(parents=True)
    fake.write_text(FAKE_NVCC.format(real=toolchain().nvcc))
    fake.chmod(0o755)
    system_tmp, root = tmp_path / "tmp", tmp_path / "cache"
    system_tmp.mkdir()
    env = {
        **os.environ,
        "CUDA_HOME": str(fake.parent.parent),
        "TMPDIR": str(system_tmp),
        "CUTE_AUTOTUNE_CACHE": str(root),
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    build = (
        f"from autotune.build.compiler import compile_config\n"
        f"from autotune.model.config import Config\n"
        f"from autotune.model.target import target_for_arch\n"
        f"compile_config(Config.from_dict({sm80_config(head_dim=64)!r}), "
        f"target_for_arch(90))\n"
    )
    process = subprocess.Popen([sys.executable, "-c", build], env=env, start_new_session=True)
    work = root / "cubins" / WORK
    deadline = time.time() + 120
    while not (work.is_dir() and any(work.iterdir())) and time.time() < deadline:
        assert process.poll() is None, "the build ended before it was killed"
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)  # the build and its nvcc
    process.wait()
    # what a kill inside `put` leaves: a staging folder named for the dead process
    host = owner_tag().split("-")[0]
    staging = root / "cubins" / "sm80" / f".{'a' * 32}.{host}-{process.pid}.xyz"
    staging.mkdir(parents=True)
    mine = root / "cubins" / "sm80" / f".{'b' * 32}.{owner_tag()}.xyz"  # a live build's
    mine.mkdir()
    monkeypatch.setenv("CUTE_AUTOTUNE_CACHE", str(root))  # the command's cache
    found, killed = leftovers(ArtifactCache(root)), list(work.iterdir())
    in_system_tmp = sorted(p.name for p in system_tmp.iterdir())
    with contextlib.redirect_stdout(io.StringIO()) as said:
        status = main(["cache", "prune"])
    fault_summary(
        {
            "case": "cubin cache: a build killed while nvcc ran, and one in put",
            "left_in_system_tmp": in_system_tmp,
            "leftovers_found": len(found),
            "prune": said.getvalue().strip().splitlines()[-1],
        }
    )
    assert in_system_tmp == []
    assert len(killed) == 1 and sorted(found) == sorted([*killed, staging])
    assert status == 0
    assert not any(work.iterdir()) and not staging.exists()
    assert mine.exists()  # a folder of a process that still runs is left to it


def test_cache_commands(cache: ArtifactCache, capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    first = _put(cache, "first", 300 * KB, used=now - 600)
    _put(cache, "second", 300 * KB, used=now - 60)
    _put(cache, "stale", 300 * KB, stale="kernel_source", used=now)
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"3 entries, 90\d\.\d KiB of 2\.0 GiB", out), out
    assert any(line.split()[:2] == ["sm80", "3"] for line in out.splitlines()), out
    assert main(["cache", "list", "--entries"]) == 0
    assert "built from other kernel sources" in capsys.readouterr().out
    assert main(["cache", "prune", "--limit", "650K"]) == 0
    out = capsys.readouterr().out
    assert "evicted 1 entries (300.3 KiB)" in out and "built from other kernel sources" in out
    assert main(["cache", "prune", "--limit", "400K"]) == 0
    assert f"sm80/{first.name}" in capsys.readouterr().out and not first.exists()
    assert main(["cache", "prune", "--limit", "much"]) == 2
    assert "a cache size is" in capsys.readouterr().err
    assert main(["cache", "clear", "--family", "sm90"]) == 0
    assert "removed 0 entries" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert survey(cache, judge=False) == []


def test_a_read_only_cache_is_listed_and_left_as_it_is(
    cache: ArtifactCache, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = _put(cache, "kept", 10 * KB, stale="nvcc")
    with read_only(entry.parent):
        report = prune(cache, 0)
        assert report.evicted == [] and entry.exists()
        assert main(["cache", "list"]) == 0
    assert "1 entries" in capsys.readouterr().out


@pytest.fixture(autouse=True)
def _no_stray_limit(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    yield
