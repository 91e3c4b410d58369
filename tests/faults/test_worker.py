"""The GPU worker reports how a dead worker died and counts every restart; a broken compile
pool is retried as infrastructure and never recorded against a config; a config's failure
holds for the toolchain it failed under only."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from sqlalchemy import text

from autotune.build import toolchain as toolchain_module
from autotune.build.cache import ArtifactCache
from autotune.build.compiler import BuildResult, compile_many
from autotune.measure.environment import Environment
from autotune.measure.worker import GpuWorker, WorkerFailure
from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.status import Status
from autotune.model.target import target_for_arch
from autotune.store.records import DeviceInfo, TrialResult
from autotune.store.repo import TuningStore
from autotune.tune.backends import ReplayBackend
from autotune.tune.search import SearchSettings, study_name, tune_problem

from .conftest import sm80_config
from .worker_requests import Echo, ExitCode, Ping, Poison, Pong, Raise, Segfault, Sleep, Unserved

REPO = Path(__file__).resolve().parents[2]
RECORDING = REPO / "tests" / "data" / "sweep_sm80_h200.json"
TASKS = ("tests.faults.worker_tasks",)
H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")


@pytest.fixture
def worker() -> Iterator[GpuWorker]:
    with GpuWorker(0, task_modules=TASKS) as w:
        yield w


def test_a_segfault_is_reported_with_its_signal_every_time(worker: GpuWorker) -> None:
    for _ in range(7):
        reply = worker.request(Segfault(), timeout=60)
        assert isinstance(reply, WorkerFailure) and reply.status is Status.CRASHED, reply
        assert "SIGSEGV" in reply.reason and "None" not in reply.reason, reply
    assert isinstance(worker.request(Ping(), timeout=60), Pong)


def test_an_exit_is_reported_with_its_code(worker: GpuWorker) -> None:
    reply = worker.request(ExitCode(3), timeout=60)
    assert isinstance(reply, WorkerFailure), reply
    assert reply.status is Status.CRASHED and "exit code 3" in reply.reason, reply


def test_a_sticky_cuda_error_counts_as_a_restart(worker: GpuWorker) -> None:
    first = worker.request(Ping(), timeout=60)
    reply = worker.request(Poison(), timeout=60)
    assert isinstance(reply, WorkerFailure)
    assert reply.status is Status.CRASHED and "CUDA context lost" in reply.reason
    second = worker.request(Ping(), timeout=60)
    assert isinstance(first, Pong) and isinstance(second, Pong)
    assert second.pid != first.pid
    assert worker.restarts == 1


# -- the typed protocol -------------------------------------------------------------------------


def test_a_reply_comes_back_as_the_record_it_was(worker: GpuWorker) -> None:
    pong = worker.request(Ping(), timeout=60)
    assert isinstance(pong, Pong) and pong == Pong(pong.pid, 0) and pong.pid != os.getpid()
    env = Environment(regime="flushed-alternating-1", torch_version="2.9", sm_clock_mhz=1980.0)
    sent = TrialResult(
        Config.from_dict(sm80_config()),
        Status.FAILED_VALIDATION,
        "race",
        12.5,
        12.0,
        13.0,
        21,
        3e-4,
        build_key="k",
        env=env,
        baseline_us=14.0,
    )
    back = worker.request(Echo(sent), timeout=60)
    assert back == sent and back is not sent
    assert isinstance(back, TrialResult) and back.status is Status.FAILED_VALIDATION


def test_a_task_that_raises_is_an_error_with_its_traceback(worker: GpuWorker) -> None:
    reply = worker.request(Raise("no such backend"), timeout=60)
    assert isinstance(reply, WorkerFailure) and reply.status is Status.ERROR
    assert reply.reason == "ValueError: no such backend" and "raise_" in reply.traceback
    assert isinstance(worker.request(Ping(), timeout=60), Pong)  # the same process serves on
    assert worker.restarts == 0


def test_a_request_no_task_serves_is_an_error(worker: GpuWorker) -> None:
    reply = worker.request(Unserved(), timeout=60)
    assert isinstance(reply, WorkerFailure) and reply.status is Status.ERROR
    assert "no task for Unserved" in reply.reason


def test_a_hang_is_a_timeout_and_the_next_request_gets_a_fresh_process(worker: GpuWorker) -> None:
    first = worker.request(Ping(), timeout=60)
    reply = worker.request(Sleep(30.0), timeout=1)
    assert isinstance(reply, WorkerFailure) and reply.status is Status.TIMEOUT
    assert "no answer within 1 s" in reply.reason
    second = worker.request(Ping(), timeout=60)
    assert isinstance(first, Pong) and isinstance(second, Pong) and second.pid != first.pid


# -- a compile pool whose worker dies -----------------------------------------------------------

FAKE_NVCC = """#!/bin/sh
# Stands in for nvcc: answers --version; else kills the compile worker that ran it (what the
# OOM killer does to a pool process), every time or only the first time.
case "$1" in --version) echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0;; esac
if [ "$MODE" = always ] || [ ! -e "$MARK" ]; then touch "$MARK"; kill -9 $PPID; sleep 5; fi
echo 'kernel.cu(1): error: static assertion failed with "fake nvcc refuses"' >&2
exit 1
"""


@pytest.fixture
def killer_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.setenv("MARK", str(tmp_path / "killed-once"))
    monkeypatch.setenv("CUTE_AUTOTUNE_CACHE", str(tmp_path / "cache"))
    toolchain_module.toolchain.cache_clear()
    yield tmp_path
    toolchain_module.toolchain.cache_clear()


CONFIGS = [
    Config.from_dict(sm80_config(**tile))
    for tile in ({"block_n": 32}, {"block_n": 64}, {"kv_stages": 3})
]


def compile_all(tmp: Path) -> list[BuildResult]:
    return compile_many(CONFIGS, target_for_arch(90), jobs=2, cache=ArtifactCache(tmp / "c"))


def test_a_dying_compile_worker_is_retried(
    killer_nvcc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODE", "once")
    results = compile_all(killer_nvcc)
    assert [r.status for r in results] == ["compile_error"] * 3
    assert all("fake nvcc refuses" in r.message for r in results), [r.message for r in results]


def test_a_compile_error_is_stored_with_its_toolchain(
    killer_nvcc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODE", "once")
    (killer_nvcc / "killed-once").touch()  # this nvcc only refuses
    (build,) = compile_many(
        CONFIGS[:1], target_for_arch(90), jobs=1, cache=ArtifactCache(killer_nvcc / "c")
    )
    assert build.status == "compile_error"
    store = TuningStore(f"sqlite:///{killer_nvcc}/t.db")
    problem = Problem(4, 16, 16, 2048, 2048, 128)
    store.record_trial(
        H200,
        problem,
        TrialResult(build.config, build.status, build.message, build_key=build.key),
        build=build,
        study="s",
        phase="search",
        baseline_us=None,
    )
    with store.engine.connect() as c:
        row = c.execute(
            text("select status, nvcc_version, cutlass_version, kernel_source_hash from builds")
        ).one()
    assert row[0] == "compile_error" and row[1] == "13.0.88" and row[2] and row[3]


def test_a_pool_that_keeps_dying_is_infrastructure_not_the_configs(
    killer_nvcc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MODE", "always")
    results = compile_all(killer_nvcc)
    assert [r.status for r in results] == ["infrastructure"] * 3
    assert all("compile worker" in r.message for r in results)


# -- failures in the search ---------------------------------------------------------------------


class FlakyBuilds(ReplayBackend):
    """A replay whose compile pool breaks for some configs (infrastructure), or whose build of
    a config fails under one toolchain only."""

    def __init__(
        self,
        *args: object,
        infra: set[str] = frozenset(),  # type: ignore[assignment]
        toolchain_tag: str = "nvcc-13.0",
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.infra = set(infra)
        self.toolchain_tag = toolchain_tag

    def build(self, configs):  # type: ignore[no-untyped-def]
        results = super().build(configs)
        return [
            BuildResult(
                r.config, r.arch, "infrastructure", message="compile worker died (the pool broke)"
            )
            if r.config.digest in self.infra
            else r
            for r in results
        ]

    def build_key(self, config: Config) -> str:
        return f"{self.toolchain_tag}-{config.digest}"


def study_digests(store: TuningStore, name: str, status: str) -> list[str]:
    study = optuna.load_study(study_name=name, storage=store.url)
    return [t.user_attrs["digest"] for t in study.trials if t.user_attrs.get("status") == status]


def test_infrastructure_failures_are_never_held_against_a_config(tmp_path: Path) -> None:
    store = TuningStore(f"sqlite:///{tmp_path}/t.db")
    first = ReplayBackend(RECORDING)
    problem = first.problems[0]
    heuristic = Config.from_dict(sm80_config())  # the family's default: tried first
    backend = FlakyBuilds(RECORDING, infra={heuristic.digest})
    settings = SearchSettings(trials=6, seed=3, warm_start=0)
    outcome = tune_problem(problem, backend, store, settings)
    assert outcome.failed == 0 and outcome.evaluated == 6
    assert all(t["status"] != "infrastructure" for t in store.trials())
    assert not any(t["config"] == heuristic.as_dict() for t in store.trials())
    # the next session, the pool healthy, measures it
    again = FlakyBuilds(RECORDING)
    tune_problem(problem, again, store, SearchSettings(trials=2, seed=3, warm_start=0))
    assert heuristic in again.build_calls
    assert any(t["config"] == heuristic.as_dict() and t["status"] == "ok" for t in store.trials())


def test_a_new_toolchain_tries_a_failed_config_again(tmp_path: Path) -> None:
    store = TuningStore(f"sqlite:///{tmp_path}/t.db")
    probe = ReplayBackend(RECORDING)
    problem = probe.problems[0]
    heuristic = Config.from_dict(sm80_config())
    old = FlakyBuilds(RECORDING, faults={heuristic.digest: ("crashed", "illegal address")})
    tune_problem(problem, old, store, SearchSettings(trials=4, seed=5, warm_start=0))
    name = study_name(old.device(), "sm80", problem)
    assert heuristic.digest in study_digests(store, name, "crashed")
    same = FlakyBuilds(RECORDING)
    tune_problem(problem, same, store, SearchSettings(trials=4, seed=5, warm_start=0))
    assert heuristic not in same.build_calls  # same toolchain: the failure stands
    newer = FlakyBuilds(RECORDING, toolchain_tag="nvcc-13.1")
    tune_problem(problem, newer, store, SearchSettings(trials=4, seed=5, warm_start=0))
    assert heuristic in newer.build_calls
    assert os.path.exists(f"{tmp_path}/t.db")
