"""One trial. The live backend's GPU worker and the recording sweep (benchmarks/sweep.py) both
run measure.trial.evaluate, and what the sweep records the replay backend serves back as the
same result; the worker protocol's records cross a process boundary intact and every request
has its task."""

from __future__ import annotations

import importlib.util
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import autotune.measure.gpu_tasks  # noqa: F401 - registers the worker's tasks
from autotune.build.compiler import BuildResult
from autotune.build.ptxas import PtxasReport
from autotune.measure import protocol, trial
from autotune.measure.environment import Environment
from autotune.measure.protocol import DeviceDescription, TrialRequest, ValidateRequest
from autotune.measure.records import DeviceInfo, TrialResult
from autotune.measure.timing import Timing
from autotune.measure.validate import CaseResult, ValidationReport
from autotune.measure.worker import TASKS, Request, WorkerFailure, _answer
from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.status import Status
from autotune.tune.backends import GpuBackend, ReplayBackend

REPO = Path(__file__).resolve().parents[2]
PROBLEM = Problem(4, 16, 16, 2048, 2048, 128, "fp16", False)
H200 = DeviceDescription(DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0"), 232448)
ENV = Environment(regime="flushed-alternating-1", torch_version="2.9", sm_clock_mhz=1980.0)


def sm_config() -> dict[str, Any]:
    return {
        "family": "sm80",
        "head_dim": 128,
        "dtype": "fp16",
        "causal": False,
        "block_m": 128,
        "block_n": 64,
        "num_warps": 4,
        "kv_stages": 2,
        "swizzle": 3,
        "q_in_regs": False,
    }


def load_sweep() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sweep", REPO / "benchmarks" / "sweep.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_build(config: Config, index: int) -> BuildResult:
    """Builds as compile_many gives them: every third one refused by nvcc."""
    if index % 3 == 2:
        return BuildResult(
            config,
            "sm_90",
            Status.COMPILE_ERROR,
            key=f"k{index}",
            message="ptxas: too many resources requested",
        )
    return BuildResult(
        config,
        "sm_90",
        Status.OK,
        key=f"k{index}",
        cubin=Path(f"/nowhere/{index}.cubin"),
        ptxas=PtxasReport("cute_autotune_fwd", "sm_90", 160 + index, 0, 0, 0, 0, 1),
    )


class Trials:
    """Stands in for measure.trial.evaluate: remembers every call, answers as a GPU would
    (times with at most 3 decimals, as the sweep rounds them)."""

    def __init__(self) -> None:
        self.calls: list[tuple[Problem, BuildResult]] = []

    def __call__(
        self,
        problem: Problem,
        build: BuildResult,
        *,
        rounds: int,
        round_ms: float,
        device: int = 0,
        warmup_ms: float | None = None,
    ) -> TrialResult:
        self.calls.append((problem, build))
        if not build.ok:
            return trial.not_built(build)
        n = int(str(build.key)[1:])
        if n % 3 == 1:
            return TrialResult(
                build.config,
                Status.FAILED_VALIDATION,
                "at the tuning shape the output differs from SDPA's by 4.1e-02",
                rel_err=2.5e-4,
                build_key=build.key,
            )
        median = 100.125 + n
        return TrialResult(
            build.config,
            Status.OK,
            "",
            median,
            median - 1.5,
            median + 2.25,
            rounds,
            3.5e-4,
            build_key=build.key,
            env=ENV,
            baseline_us=130.5,
        )


@pytest.fixture
def trials(monkeypatch: pytest.MonkeyPatch) -> Iterator[Trials]:
    stand_in = Trials()
    monkeypatch.setattr(trial, "evaluate", stand_in)
    yield stand_in


class InProcessWorker:
    """A GpuWorker that answers in this process with the worker's own dispatch, each request
    and reply pickled as across the pipe."""

    def __init__(self, failure: WorkerFailure | None = None) -> None:
        self.failure = failure

    def request(self, request: Request[Any], timeout: float = 120.0) -> Any:
        if self.failure is not None:
            return self.failure
        return pickle.loads(pickle.dumps(_answer(pickle.loads(pickle.dumps(request)), 0)))

    def close(self) -> None:
        pass


def live_backend(worker: InProcessWorker) -> GpuBackend:
    backend = GpuBackend()
    backend._worker = worker  # type: ignore[assignment]
    return backend


def sweep(monkeypatch: pytest.MonkeyPatch, limit: int) -> dict[str, Any]:
    module = load_sweep()
    monkeypatch.setattr(
        module,
        "compile_many",
        lambda configs, target: [fake_build(c, i) for i, c in enumerate(configs)],
    )
    monkeypatch.setattr(
        module,
        "time_sdpa",
        lambda problem, rounds, round_ms: {
            "default": Timing(130.0, 129.0, 131.0, 42),
            "flash": Timing(140.0, 139.0, 142.0, 42),
        },
    )
    monkeypatch.setattr(module.torch.cuda, "current_device", lambda: 0)
    shape: dict[str, Any] = module.sweep_shape(PROBLEM, 5, 10.0, limit=limit)
    return shape


def test_the_sweep_and_the_live_backend_run_the_same_trial(
    trials: Trials, monkeypatch: pytest.MonkeyPatch
) -> None:
    shape = sweep(monkeypatch, limit=6)
    assert len(shape["configs"]) == 6
    swept = [build for _, build in trials.calls]
    assert [b.config.as_dict() for b in swept] == [row["config"] for row in shape["configs"]]
    assert all(problem == PROBLEM for problem, _ in trials.calls)

    trials.calls.clear()
    backend = live_backend(InProcessWorker())
    ok, failing = swept[0], swept[1]
    live = backend.evaluate(PROBLEM, ok, rounds=5, round_ms=10.0)
    assert [b for _, b in trials.calls] == [ok]  # through the worker's trial task
    assert live == trial.evaluate(PROBLEM, ok, rounds=5, round_ms=10.0)
    assert live.status is Status.OK and live.env == ENV and live.baseline_us == 130.5
    assert backend.evaluate(PROBLEM, failing, rounds=5, round_ms=10.0).status is (
        Status.FAILED_VALIDATION
    )


def test_what_the_sweep_records_replays_as_the_trial_it_was(
    trials: Trials, monkeypatch: pytest.MonkeyPatch
) -> None:
    shape = sweep(monkeypatch, limit=6)
    live = {
        build.config.digest: trial.evaluate(PROBLEM, build, rounds=5, round_ms=10.0)
        for _, build in list(trials.calls)
    }
    recording = json.loads(
        json.dumps({"device": H200.as_dict(), "family": "sm80", "shapes": [shape]})
    )  # as the sweep writes it
    replay = ReplayBackend(recording)
    configs = [Config.from_dict(row["config"]) for row in shape["configs"]]
    statuses = set()
    for build in replay.build(configs):
        served = replay.evaluate(PROBLEM, build, rounds=5, round_ms=10.0)
        want = live[build.config.digest]
        statuses.add(want.status)
        assert (
            served.status,
            served.reason,
            served.median_us,
            served.p20_us,
            served.p80_us,
            served.rel_err,
            served.baseline_us,
        ) == (
            want.status,
            want.reason,
            want.median_us,
            want.p20_us,
            want.p80_us,
            want.rel_err,
            want.baseline_us,
        ), build.config
    assert statuses == {Status.OK, Status.FAILED_VALIDATION, Status.COMPILE_ERROR}
    assert {b.backend: b.median_us for b in replay.baselines(PROBLEM)} == {
        "default": 130.0,
        "flash": 140.0,
    }


def test_check_validates_through_the_trial_module(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[BuildResult, int | None]] = []
    report = ValidationReport(True, 7, (CaseResult("aligned", "B2", True, rel_err=1e-4),))

    def check(build: BuildResult, *, device: int = 0, seed: int | None = None) -> ValidationReport:
        seen.append((build, seed))
        return report

    monkeypatch.setattr(trial, "check", check)
    build = fake_build(Config.from_dict(sm_config()), 0)
    assert _answer(ValidateRequest(build, seed=7), 0) == report
    assert seen == [(build, 7)]


def test_a_validation_made_by_check_is_not_made_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # the sweep times builds that `cute-autotune check` processes validated beside it
    build = fake_build(Config.from_dict(sm_config()), 0)
    report = ValidationReport(
        False,
        3,
        (
            CaseResult("aligned", "B2", True, rel_err=1e-4),
            CaseResult("odd", "B1", False, "max abs err 0.5", rel_err=0.25),
        ),
    )
    checked = tmp_path / "check.json"
    checked.write_text(
        json.dumps(
            {
                "results": [
                    {
                        "config": sm_config(),
                        "cubin": str(build.cubin),
                        "validation": {
                            "status": "failed",
                            "reason": report.summary(),
                            "report": report.as_dict(),
                        },
                    },
                    {"config": sm_config(), "cubin": None, "validation": {"status": "not_run"}},
                ]
            }
        )
    )
    verdicts = load_sweep().read_verdicts([str(checked)])
    assert list(verdicts) == [str(build.cubin)]  # (NaN errors: compare what they write)
    assert verdicts[str(build.cubin)].as_dict().__repr__() == report.as_dict().__repr__()
    monkeypatch.setattr(trial, "_validated", {})
    monkeypatch.setattr(trial, "check", lambda *a, **k: pytest.fail("validated again"))
    trial.remember_verdict(build, verdicts[str(build.cubin)])
    result = trial.evaluate(PROBLEM, build, rounds=1, round_ms=1.0)
    assert result.status == Status.FAILED_VALIDATION and "max abs err 0.5" in result.reason
    assert result.rel_err == 0.25


def test_every_request_has_its_task_and_crosses_the_pipe_intact() -> None:
    kinds = {
        k
        for k in vars(protocol).values()
        if isinstance(k, type) and issubclass(k, Request) and k is not Request
    }
    assert len(kinds) == 5 and kinds <= set(TASKS)
    request = TrialRequest(PROBLEM, fake_build(Config.from_dict(sm_config()), 0), 5, 10.0)
    again = pickle.loads(pickle.dumps(request))
    assert again == request and again.build.status is Status.OK
    assert again.build.ptxas == request.build.ptxas


@pytest.mark.parametrize("status", [Status.CRASHED, Status.TIMEOUT, Status.ERROR])
def test_a_worker_failure_is_the_trials_status(status: Status) -> None:
    backend = live_backend(
        InProcessWorker(WorkerFailure(status, "worker process killed by SIGSEGV (signal 11)"))
    )
    builds = [fake_build(Config.from_dict(sm_config()), 0)]
    result = backend.evaluate(PROBLEM, builds[0], rounds=5, round_ms=10.0)
    assert result.status is status and "SIGSEGV" in result.reason
    assert result.build_key == "k0" and result.median_us is None
    reranked = backend.rerank(PROBLEM, builds, rounds=5, round_ms=10.0)
    assert [r.status for r in reranked.results] == [status] and not reranked.baselines
    with pytest.raises(RuntimeError, match="timing torch SDPA failed: worker process killed"):
        backend.baselines(PROBLEM)


def test_a_build_that_failed_never_reaches_the_worker() -> None:
    backend = live_backend(InProcessWorker(WorkerFailure(Status.CRASHED, "must not be asked")))
    build = fake_build(Config.from_dict(sm_config()), 2)
    result = backend.evaluate(PROBLEM, build, rounds=5, round_ms=10.0)
    assert result == trial.not_built(build)
    assert result.status is Status.COMPILE_ERROR and "too many resources" in result.reason


@pytest.mark.parametrize("backward", [False, True])
def test_a_config_of_the_other_pass_is_refused_before_it_runs(backward: bool) -> None:
    """A backward config sent for a forward problem (or the reverse) is an invalid trial, said
    so, before any validation or launch (nothing here could run one: no GPU)."""
    from autotune.model.space import load_space

    problem = Problem(2, 8, 2, 512, 512, 128, "bf16", True, backward=backward)
    if backward:
        values = {k: v for k, v in sm_config().items() if k != "family"}
        config: Config = load_space("sm80").config(**{**values, "dtype": "bf16"})
    else:
        bwd = load_space("bwd")
        default = bwd.heuristic({"head_dim": 128, "dtype": "bf16", "causal": True})
        assert default is not None
        config = default
    build = BuildResult(
        config,
        "sm_90",
        Status.OK,
        key="k",
        cubin=Path("/nowhere/k.cubin"),
        ptxas=PtxasReport("cute_autotune_fwd", "sm_90", 160, 0, 0, 0, 0, 1),
    )
    result = trial.evaluate(problem, build, rounds=3, round_ms=1.0)
    assert result.status == Status.INVALID
    wanted = "not its gradients" if backward else "not a forward problem's output"
    assert wanted in result.reason
