from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

# A real PostgreSQL server (.ci/run starts one): the URL of a database this user may create
# databases from, e.g. postgresql+psycopg://postgres@/postgres?host=/tmp/pg&port=55432
PG_ENV = "CUTE_AUTOTUNE_TEST_PG_URL"
# Long runs (the fault suite's kill rounds, every seed of a search replay) run when this is 1;
# the default run keeps a sample of each, so that it stays a CI run.
LONG_ENV = "CUTE_AUTOTUNE_LONG_TESTS"
LONG = os.environ.get(LONG_ENV, "0") not in ("", "0")
# 0 turns off the run's memo of nvcc builds (tests/nvcc_memo.py)
NVCC_MEMO_ENV = "CUTE_AUTOTUNE_TEST_NVCC_MEMO"
REAL_CUDA_HOME_ENV = "CUTE_AUTOTUNE_TEST_REAL_CUDA_HOME"  # the toolkit behind the memo


def _gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _nvcc_available() -> bool:
    from autotune.build.toolchain import ToolchainError, find_nvcc

    try:
        find_nvcc()
    except ToolchainError:
        return False
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    no_nvcc = pytest.mark.skip(reason="needs nvcc (the CUDA toolkit)")
    no_postgres = pytest.mark.skip(reason=f"needs a PostgreSQL server (${PG_ENV})")
    long_run = pytest.mark.skip(reason=f"a long run (${LONG_ENV}=1 runs it)")
    gpu, nvcc = _gpu_available(), _nvcc_available()
    for item in items:
        if "gpu" in item.keywords and not gpu:
            item.add_marker(no_gpu)
        if "nvcc" in item.keywords and not nvcc:
            item.add_marker(no_nvcc)
        if "postgres" in item.keywords and not os.environ.get(PG_ENV):
            item.add_marker(no_postgres)
        if "long" in item.keywords and not LONG:
            item.add_marker(long_run)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto` (README command 2): one worker per core on a machine without a GPU (each test
    file on one worker, `--dist loadfile`, so a module's shared fixture is made once); one
    worker where a GPU is, whose tests time and fill it and would measure each other."""
    return 1 if _gpu_available() else None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Collect tests/build (the tests of autotune.build): pytest's default norecursedirs skips
    every folder named build."""
    if collection_path == Path(__file__).resolve().parent / "build":
        return False
    return None


@pytest.fixture(scope="session", autouse=True)
def nvcc_memo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The run's nvcc remembers its builds (tests/nvcc_memo.py): a CUDA home whose bin/nvcc is
    the memo in front of the real one and whose include/ is the toolkit's, as $CUDA_HOME, so
    that the processes the tests start use it too. A test that brings its own nvcc sets its
    own $CUDA_HOME."""
    from autotune.build import toolchain as toolchain_module
    from autotune.build.toolchain import ToolchainError, find_nvcc

    try:
        real = find_nvcc()
    except ToolchainError:
        real = None
    if real is None or os.environ.get(NVCC_MEMO_ENV, "1") == "0":
        yield
        return
    home = tmp_path_factory.mktemp("cuda-home")
    # Under pytest-xdist every worker is a session of its own: the workers share one memo
    # (beside their base folders), so a build any of them made is made once.
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    shared = tmp_path_factory.getbasetemp().parent if worker else home
    (home / "bin").mkdir()
    (home / "include").symlink_to(real.parent.parent / "include")
    memo = Path(__file__).resolve().parent / "nvcc_memo.py"
    wrapper = home / "bin" / "nvcc"
    wrapper.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" "{memo}" "{real}" "{shared / "nvcc-memo"}" "$@"\n'
    )
    wrapper.chmod(0o755)
    before = os.environ.get("CUDA_HOME")
    os.environ["CUDA_HOME"] = str(home)
    os.environ[REAL_CUDA_HOME_ENV] = str(real.parent.parent)
    toolchain_module.toolchain.cache_clear()
    try:
        yield
    finally:
        os.environ.pop(REAL_CUDA_HOME_ENV, None)
        if before is None:
            os.environ.pop("CUDA_HOME", None)
        else:
            os.environ["CUDA_HOME"] = before
        toolchain_module.toolchain.cache_clear()


@pytest.fixture(autouse=True)
def output_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's tables at the width they have when stdout is not a terminal (autotune.cli.table),
    whatever terminal or test runner (a pytest-xdist worker reads 80 columns) runs the tests: a
    test of a table's text does not depend on who runs it. A test may set its own."""
    from autotune.cli.table import DEFAULT_WIDTH

    monkeypatch.setenv("COLUMNS", str(DEFAULT_WIDTH))


@pytest.fixture
def real_nvcc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The toolkit's own nvcc for one test, past the run's memo: a test of what nvcc itself
    does (such as running out of time) that a remembered build would answer at once."""
    from autotune.build import toolchain as toolchain_module

    if os.environ.get(REAL_CUDA_HOME_ENV):
        monkeypatch.setenv("CUDA_HOME", os.environ[REAL_CUDA_HOME_ENV])
    toolchain_module.toolchain.cache_clear()
    yield
    monkeypatch.undo()
    toolchain_module.toolchain.cache_clear()


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private cache directory for one test."""
    root = tmp_path / "cache"
    monkeypatch.setenv("CUTE_AUTOTUNE_CACHE", str(root))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test (dropped afterwards)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin_url = make_url(os.environ[PG_ENV])
    name = f"cute_autotune_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
