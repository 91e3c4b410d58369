"""The work a GPU worker process does for a tuning session (or `cute-autotune check`): one
trial, the validator alone, finalists re-timed together, torch SDPA's backends timed, the device
described. One task per request type of measure.protocol, registered with measure.worker.

Runs inside `worker.GpuWorker` processes; the trial itself is measure.trial, the shared inputs
measure.inputs.
"""

from __future__ import annotations

from ..build.compiler import BuildResult
from ..launch.kernel import CompiledKernel
from ..model.problem import Problem
from ..model.space import load_space
from ..model.status import Status
from . import trial
from .backward_inputs import (
    backward_inputs,
    backward_kernel_candidate,
    backward_sdpa_candidate,
    backward_sdpa_candidates,
)
from .inputs import kernel_candidate, problem_inputs, sdpa_candidate, sdpa_candidates, timed_env
from .protocol import (
    Baselines,
    BaselinesRequest,
    DeviceDescription,
    DeviceRequest,
    Reranked,
    RerankRequest,
    TrialRequest,
    ValidateRequest,
)
from .records import BaselineTiming, DeviceInfo, TrialResult
from .timing import Candidate, Timing, measure
from .validate import ValidationReport
from .worker import register_task

__all__ = ["describe_device", "problem_inputs", "time_sdpa"]  # problem_inputs: for benchmarks


# The trial and the validation are measure.trial's, called through the module so that a test
# can stand in for them.
def task_trial(request: TrialRequest, device: int) -> TrialResult:
    return trial.evaluate(
        request.problem,
        request.build,
        rounds=request.rounds,
        round_ms=request.round_ms,
        device=device,
    )


def task_validate(request: ValidateRequest, device: int) -> ValidationReport:
    return trial.check(request.build, device=device, seed=request.seed)


def _timed(build: BuildResult, timing: Timing, device: int) -> TrialResult:
    return TrialResult(
        build.config,
        Status.OK,
        "",
        timing.median_us,
        timing.p20_us,
        timing.p80_us,
        timing.rounds,
        build_key=build.key,
        env=timed_env(timing, device),
    )


def _n_sets(problem: Problem) -> int:
    return len(backward_inputs(problem) if problem.backward else problem_inputs(problem))


def _kernel_candidate(build: BuildResult, problem: Problem, device: int) -> Candidate:
    """A built config on `problem`'s input sets: the forward kernel, or for a backward
    problem the backward kernel on its sets."""
    if problem.backward:
        from ..launch.backward import CompiledBackward

        return backward_kernel_candidate(CompiledBackward(build, device), problem)
    return kernel_candidate(CompiledKernel(build, device), problem)


def _sdpa_candidate(problem: Problem, backend: str) -> Candidate | None:
    """One SDPA backend on `problem`: its forward, or for a backward problem torch's backward
    of it."""
    if problem.backward:
        return backward_sdpa_candidate(problem, backend)
    return sdpa_candidate(problem, backend)


def task_rerank(request: RerankRequest, device: int) -> Reranked:
    """Re-time finalists (kernel configs, already validated, and torch SDPA configs: family
    `sdpa`, one per backend) together in one alternation, so the winner and its speed-up over
    SDPA come from one measurement. An SDPA backend that refuses the problem comes back as
    INVALID with the reason. A backward problem's finalists are backward configs and torch's
    backwards, timed alike."""
    problem = request.problem
    n_sets = _n_sets(problem)
    fns: dict[str, Candidate] = {}
    refused: dict[str, TrialResult] = {}
    for build in request.builds:
        config, digest = build.config, build.config.digest
        if load_space(config.family).compiled:
            fns[digest] = _kernel_candidate(build, problem, device)
            continue
        candidate = _sdpa_candidate(problem, str(config["backend"]))
        if candidate is None:
            refused[digest] = TrialResult(
                config,
                Status.INVALID,
                f"torch SDPA's {config['backend']} backend refuses this problem",
                build_key=build.key,
            )
        else:
            fns[digest] = candidate
    timings = measure(fns, n_sets=n_sets, rounds=request.rounds, round_ms=request.round_ms)
    return Reranked(
        tuple(
            refused[b.config.digest]
            if b.config.digest in refused
            else _timed(b, timings[b.config.digest], device)
            for b in request.builds
        )
    )


def time_sdpa(problem: Problem, *, rounds: int, round_ms: float) -> dict[str, Timing]:
    """Every SDPA backend that accepts the problem, timed together, by backend (for a
    backward problem, torch's backward of each)."""
    return measure(
        backward_sdpa_candidates(problem) if problem.backward else sdpa_candidates(problem),
        n_sets=_n_sets(problem),
        rounds=rounds,
        round_ms=round_ms,
    )


def task_baselines(request: BaselinesRequest, device: int) -> Baselines:
    timings = time_sdpa(request.problem, rounds=request.rounds, round_ms=request.round_ms)
    return Baselines(
        tuple(
            BaselineTiming(name, t.median_us, t.p20_us, t.p80_us, timed_env(t, device))
            for name, t in timings.items()
        )
    )


def describe_device(device: int) -> DeviceDescription:
    import torch

    from .environment import driver_version

    props = torch.cuda.get_device_properties(device)
    info = DeviceInfo(
        props.name,
        props.major * 10 + props.minor,
        props.multi_processor_count,
        driver_version(),
        str(torch.version.cuda),
    )
    return DeviceDescription(info, int(getattr(props, "shared_memory_per_block_optin", 0)))


def task_device(request: DeviceRequest, device: int) -> DeviceDescription:
    return describe_device(device)


register_task(TrialRequest, task_trial)
register_task(ValidateRequest, task_validate)
register_task(RerankRequest, task_rerank)
register_task(BaselinesRequest, task_baselines)
register_task(DeviceRequest, task_device)
