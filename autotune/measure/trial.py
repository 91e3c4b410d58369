"""One trial: is a built config right, and how fast is it on a problem.

The only trial code there is. The live tuning backend runs `evaluate` in its GPU worker
(measure.gpu_tasks), `cute-autotune check` runs `check` (the validation alone) there, and the
recording sweep (benchmarks/sweep.py) runs `evaluate` in its own process, so that what the
replay backend serves and what live tuning measures come from one procedure: the same inputs,
the same validator, the same threshold, the same timing regime beside the same baseline. A
backward problem's trial (`evaluate_backward`) is the same procedure on the gradients
(measure.backward_inputs, measure.validate_backward), beside torch's backward.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

from ..build.compiler import BuildResult
from ..launch.kernel import CompiledKernel
from ..model.problem import Problem
from ..model.space import BACKWARD, FORWARD, load_space
from ..model.status import Status
from .backward_inputs import (
    backward_inputs,
    backward_kernel_candidate,
    backward_sdpa_candidate,
    gradient_difference,
    reference_gradients,
)
from .inputs import kernel_candidate, problem_inputs, reference_output, sdpa_candidate, timed_env
from .records import TrialResult
from .timing import Candidate, measure
from .validate import ValidationReport, validate
from .validate_backward import GradientReport, kernel_runner, validate_backward
from .validate_kvcache import validate_kvcache

# How far a trial's output at the tuning shape may be from SDPA's default (relative L2 norm).
# Looser than the validator's bounds against the fp32 reference, since SDPA's default rounds in
# fp16/bf16 too; the validator has already run its own cases, this catches what only the tuning
# shape shows (its tails, its grid).
TUNING_SHAPE_TOL = 2e-2
SDPA_DEFAULT = "sdpa:default"  # the baseline's name among the timed candidates

# Validation verdicts of this process by cubin: a config tuned for many shapes of one problem
# class is the same binary on the same GPU, validated once (the validator's cases do not depend
# on the tuning shape; the output at the tuning shape is still compared with SDPA every trial).
_validated: dict[str, tuple[bool, str, float]] = {}


def not_built(build: BuildResult) -> TrialResult:
    """The trial of a config that did not build: nothing ran, the build's status says why."""
    return TrialResult(build.config, build.status, build.message, build_key=build.key)


def check(build: BuildResult, *, device: int = 0, seed: int | None = None) -> ValidationReport:
    """The full validator (measure.validate) on a built config, on its own problem class; a
    split-KV kernel (the decode family) also gets the KV-cache cases (measure.validate_kvcache)."""
    import torch

    config = build.config
    kernel = CompiledKernel(build, device)
    values: dict[str, Any] = {
        "head_dim": int(config["head_dim"]),
        "dtype": str(config["dtype"]),
        "causal": bool(config["causal"]),
    }
    report = validate(kernel, **values, device=f"cuda:{device}", seed=seed)
    if not kernel.split_kv:
        return report
    kv = validate_kvcache(
        kernel,
        **values,
        device=torch.device("cuda", device),
        seed=report.seed,
        reads_caches=load_space(config.family).kv_caches,
    )
    return ValidationReport(
        report.passed and all(c.passed for c in kv), report.seed, report.cases + kv
    )


def remember_verdict(build: BuildResult, report: ValidationReport) -> None:
    """Take a validation of this cubin made elsewhere (`cute-autotune check` in processes beside
    this one, benchmarks/sweep.py --verdicts) as this process's own, so `evaluate` does not
    validate it again."""
    _validated[str(build.cubin)] = (report.passed, report.summary(), report.worst_rel_err)


def _verdict(build: BuildResult, device: int) -> tuple[bool, str, float]:
    key = str(build.cubin)
    if key not in _validated:
        report = check(build, device=device)
        _validated[key] = (report.passed, report.summary(), report.worst_rel_err)
    return _validated[key]


def _screened(
    build: BuildResult,
    direction: str,
    verdict: Callable[[BuildResult, int], tuple[bool, str, float]],
    device: int,
) -> TrialResult | float:
    """What stops a trial before it is timed: a build that failed, a config of the other pass
    (`direction` is the problem's), or the validator's verdict (`verdict`, once per cubin)
    against it; else the validator's worst error."""
    if not build.ok:
        return not_built(build)
    if load_space(build.config.family).direction != direction:
        computes = "a backward pass" if direction == FORWARD else "the forward pass"
        asked = "a forward problem's output" if direction == FORWARD else "its gradients"
        return TrialResult(
            build.config,
            Status.INVALID,
            f"{build.name} computes {computes}, not {asked}",
            build_key=build.key,
        )
    passed, summary, worst = verdict(build, device)
    if not passed:
        return TrialResult(
            build.config, Status.FAILED_VALIDATION, summary, rel_err=worst, build_key=build.key
        )
    return worst


def _timed_beside_sdpa(
    build: BuildResult,
    call: Candidate,
    reference: Candidate | None,
    *,
    n_sets: int,
    rel_err: float,
    rounds: int,
    round_ms: float,
    warmup_ms: float | None,
    device: int,
) -> TrialResult:
    """A validated config's trial: `call` timed alternating call by call with SDPA's default
    (`reference`, where it runs the problem), whose median comes back beside it."""
    candidates: dict[str, Candidate] = {build.name: call}
    if reference is not None:
        candidates[SDPA_DEFAULT] = reference
    timings = (
        measure(candidates, n_sets=n_sets, rounds=rounds, round_ms=round_ms)
        if warmup_ms is None
        else measure(
            candidates, n_sets=n_sets, rounds=rounds, round_ms=round_ms, warmup_ms=warmup_ms
        )
    )
    timing, baseline = timings[build.name], timings.get(SDPA_DEFAULT)
    return TrialResult(
        build.config,
        Status.OK,
        "",
        timing.median_us,
        timing.p20_us,
        timing.p80_us,
        timing.rounds,
        rel_err,
        build_key=build.key,
        env=timed_env(timing, device),
        baseline_us=baseline.median_us if baseline else None,
    )


def check_backward(
    build: BuildResult, *, device: int = 0, seed: int | None = None
) -> GradientReport:
    """The gradient validator (measure.validate_backward) on a built backward config, on its
    own problem class, in its own mode (a deterministic config must be bit-identical)."""
    from ..launch.backward import CompiledBackward

    kernel = CompiledBackward(build, device)
    config = build.config
    return validate_backward(
        kernel_runner(kernel),
        head_dim=int(config["head_dim"]),
        dtype=str(config["dtype"]),
        causal=bool(config["causal"]),
        device=f"cuda:{device}",
        seed=seed,
        deterministic=kernel.deterministic,
    )


def _backward_verdict(build: BuildResult, device: int) -> tuple[bool, str, float]:
    key = str(build.cubin)
    if key not in _validated:
        report = check_backward(build, device=device)
        worst = max((max(c.rel_err.values(), default=0.0) for c in report.cases), default=0.0)
        _validated[key] = (report.passed, report.summary(), worst)
    return _validated[key]


def evaluate_backward(
    problem: Problem,
    build: BuildResult,
    *,
    rounds: int,
    round_ms: float,
    device: int = 0,
    warmup_ms: float | None = None,
) -> TrialResult:
    """`evaluate` for a backward problem and a backward config: the gradient validator (once
    per cubin in this process), the gradients at the tuning shape against SDPA's default
    backward's, then the backward (its preprocess, main and postprocess entries) timed
    alternating call by call with torch's backward of SDPA's default, whose median comes back
    beside it."""
    from ..launch.backward import CompiledBackward

    screened = _screened(build, BACKWARD, _backward_verdict, device)
    if isinstance(screened, TrialResult):
        return screened
    worst = screened
    failed = partial(
        TrialResult, build.config, Status.FAILED_VALIDATION, rel_err=worst, build_key=build.key
    )
    kernel = CompiledBackward(build, device)
    sets = backward_inputs(problem)
    call = backward_kernel_candidate(kernel, problem)
    err = gradient_difference(call(0), reference_gradients(problem))
    if not math.isfinite(err) or err > TUNING_SHAPE_TOL:
        return failed(f"at the tuning shape the gradients differ from SDPA's by {err:.2e}")
    return _timed_beside_sdpa(
        build,
        call,
        backward_sdpa_candidate(problem, "default"),
        n_sets=len(sets),
        rel_err=worst,
        rounds=rounds,
        round_ms=round_ms,
        warmup_ms=warmup_ms,
        device=device,
    )


def evaluate(
    problem: Problem,
    build: BuildResult,
    *,
    rounds: int,
    round_ms: float,
    device: int = 0,
    warmup_ms: float | None = None,
) -> TrialResult:
    """Validate a built config (the full validator, once per cubin in this process), compare
    its output at the tuning shape with SDPA's default, then time it on the problem alternating
    call by call with SDPA's default (measure.timing), whose median comes back beside it.
    `warmup_ms` shortens the warm-up before the timed calls where the GPU is kept busy by the
    trials before (an exhaustive sweep); by default the timing regime's own."""
    if problem.backward:
        return evaluate_backward(
            problem, build, rounds=rounds, round_ms=round_ms, device=device, warmup_ms=warmup_ms
        )
    screened = _screened(build, FORWARD, _verdict, device)
    if isinstance(screened, TrialResult):
        return screened
    worst = screened
    failed = partial(
        TrialResult, build.config, Status.FAILED_VALIDATION, rel_err=worst, build_key=build.key
    )
    kernel = CompiledKernel(build, device)
    if problem.kv_cache != "dense" and not kernel.split_kv:
        return TrialResult(
            build.config,
            Status.INVALID,
            f"{build.name} cannot read a {problem.kv_cache} KV cache",
            build_key=build.key,
        )
    sets = problem_inputs(problem)
    call = kernel_candidate(kernel, problem)
    out, _ = call(0)
    expected = reference_output(problem)
    err = float((out.float() - expected).norm() / expected.norm())
    if not math.isfinite(err) or err > TUNING_SHAPE_TOL:
        return failed(f"at the tuning shape the output differs from SDPA's by {err:.2e}")
    return _timed_beside_sdpa(
        build,
        call,
        sdpa_candidate(problem, "default"),
        n_sets=len(sets),
        rel_err=worst,
        rounds=rounds,
        round_ms=round_ms,
        warmup_ms=warmup_ms,
        device=device,
    )
