"""Work a GPU worker process does for a tuning session: validate and time one trial, re-time a
few finalists interleaved, time torch SDPA's backends, describe the device.

Runs only inside `worker.GpuWorker` processes. Input tensors of a problem are generated once per
process and reused by every trial and baseline of that problem, so all candidates and SDPA see
the same data; there are enough input sets to rotate through 3x the L2 cache.
"""

from __future__ import annotations

import math
from typing import Any

from ..build.compiler import compile_config
from ..launch.kernel import CompiledKernel
from ..model.config import Config
from ..model.problem import Problem
from ..model.space import load_space
from ..model.target import Target
from .sdpa import accepted_backends
from .validate import validate
from .worker import register_task

_inputs: dict[Problem, list[tuple[Any, ...]]] = {}
# Validation verdicts of this process by cubin: a config tuned for many shapes of one problem
# class is the same binary on the same GPU, validated once (the validator's cases do not depend
# on the tuning shape; the output at the tuning shape is still compared with SDPA every trial).
_validated: dict[str, tuple[bool, str, float]] = {}


def problem_inputs(problem: Problem) -> list[tuple[Any, ...]]:
    import torch

    from ..launch.tensors import torch_dtype
    from .timing import input_sets_needed

    if problem not in _inputs:
        _inputs.clear()  # one problem at a time keeps device memory bounded
        _sdpa.clear()
        _expected.clear()
        dtype = torch_dtype(problem.dtype)
        q_shape = (problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim)
        kv_shape = (problem.batch, problem.heads_kv, problem.seqlen_k, problem.head_dim)
        set_bytes = 2 * (2 * math.prod(q_shape) + 2 * math.prod(kv_shape))
        l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        sets = []
        for _ in range(input_sets_needed(set_bytes, l2)):
            q = torch.randn(q_shape, device="cuda", dtype=dtype)
            k = torch.randn(kv_shape, device="cuda", dtype=dtype)
            v = torch.randn(kv_shape, device="cuda", dtype=dtype)
            sets.append((q, k, v, torch.empty_like(q)))
        _inputs[problem] = sets
    return _inputs[problem]


# Of the problem whose inputs are held: torch SDPA's backends that accept it, per input set
# (each backend tried once per set, not once per trial), and SDPA's output on the first set.
_sdpa: dict[Problem, list[dict[str, Any]]] = {}
_expected: dict[Problem, Any] = {}


def problem_sdpa(problem: Problem) -> list[dict[str, Any]]:
    """Per input set of `problem_inputs`, the SDPA backends that run it, as calls."""
    sets = problem_inputs(problem)
    if problem not in _sdpa:
        _sdpa[problem] = [accepted_backends(*s[:3], causal=problem.causal) for s in sets]
    return _sdpa[problem]


def _reference_output(problem: Problem) -> Any:
    if problem not in _expected:
        _expected[problem] = problem_sdpa(problem)[0]["default"]().float()
    return _expected[problem]


def _kernel(config_json: str, target: dict[str, Any], device: int) -> tuple[Config, Any]:
    config = Config.from_json(config_json)
    build = compile_config(config, Target(**target))
    if not build.ok:
        raise RuntimeError(f"{build.status}: {build.message}")
    return config, CompiledKernel(build, device)


def task_validate(payload: dict[str, Any]) -> dict[str, Any]:
    """The validator on one config (what `cute-autotune check` asks for)."""
    config, kernel = _kernel(payload["config"], payload["target"], payload["device"])
    report = validate(kernel, head_dim=int(config["head_dim"]), dtype=str(config["dtype"]),
                      causal=bool(config["causal"]), device=f"cuda:{payload['device']}",
                      seed=payload.get("seed"))
    return {"status": "passed" if report.passed else "failed", "reason": report.summary(),
            "report": report.as_dict()}


def _environment(device: int) -> Any:
    """This worker's software versions (read once), with the regime's name."""
    from .environment import software
    from .timing import REGIME

    if device not in _software:
        _software[device] = software(REGIME)
    return _software[device]


_software: dict[int, Any] = {}


def _timing_reply(timing: Any, device: int) -> dict[str, Any]:
    env = _environment(device).with_clock((timing.sm_clock_mhz, timing.power_w))
    return {"status": "ok", "median_us": timing.median_us, "p20_us": timing.p20_us,
            "p80_us": timing.p80_us, "rounds": timing.rounds, "env": env.as_dict()}


def _sdpa_candidate(problem: Problem, backend: str) -> Any:
    """One SDPA backend over the input sets as a timing candidate; None if it refuses."""
    per_set = problem_sdpa(problem)
    if any(backend not in b for b in per_set):
        return None
    return lambda i: per_set[i][backend]()


def task_trial(payload: dict[str, Any]) -> dict[str, Any]:
    """Validate one config (full validator) then time it on the problem, alternating call by
    call with SDPA's default (the regime of measure.timing), whose timing comes back too."""
    from .timing import measure

    problem = Problem(**payload["problem"])
    config, kernel = _kernel(payload["config"], payload["target"], payload["device"])
    result: dict[str, Any] = {"status": "ok", "reason": ""}
    if payload.get("validate", True):
        key = str(kernel.build.cubin)
        if key not in _validated:
            report = validate(kernel, head_dim=problem.head_dim, dtype=problem.dtype,
                              causal=problem.causal, device=f"cuda:{payload['device']}")
            _validated[key] = (report.passed, report.summary(), report.worst_rel_err)
        passed, summary, worst = _validated[key]
        result["rel_err"] = worst
        if not passed:
            return {**result, "status": "failed_validation", "reason": summary}
    sets = problem_inputs(problem)
    out, _ = kernel(*sets[0][:3])
    expected = _reference_output(problem)
    err = float((out.float() - expected).norm() / expected.norm())
    if not math.isfinite(err) or err > 2e-2:
        return {**result, "status": "failed_validation",
                "reason": f"at the tuning shape the output differs from SDPA's by {err:.2e}"}
    name = load_space(config.family).name_of(config)
    candidates = {name: lambda i: kernel(*sets[i][:3], out=sets[i][3])}
    reference = _sdpa_candidate(problem, "default")
    if reference is not None:
        candidates["sdpa:default"] = reference
    timings = measure(candidates, n_sets=len(sets), rounds=payload["rounds"],
                      round_ms=payload["round_ms"])
    reply = {**result, **_timing_reply(timings[name], payload["device"])}
    if reference is not None:
        reply["baseline"] = _timing_reply(timings["sdpa:default"], payload["device"])
    return reply


def task_rerank(payload: dict[str, Any]) -> dict[str, Any]:
    """Re-time finalists (kernel configs, already validated, and torch SDPA configs: family
    `sdpa`, one per backend) together in one alternation, so the winner and its speed-up over
    SDPA come from one measurement. An SDPA backend that refuses the problem comes back as
    "invalid" with the reason."""
    from .timing import measure

    problem = Problem(**payload["problem"])
    sets = problem_inputs(problem)
    fns: dict[str, Any] = {}
    refused: dict[str, dict[str, Any]] = {}
    for config_json in payload["configs"]:
        config = Config.from_json(config_json)
        if load_space(config.family).compiled:
            _, kernel = _kernel(config_json, payload["target"], payload["device"])
            fns[config_json] = (lambda i, kernel=kernel: kernel(*sets[i][:3], out=sets[i][3]))
            continue
        candidate = _sdpa_candidate(problem, str(config["backend"]))
        if candidate is None:
            refused[config_json] = {"status": "invalid", "reason": f"torch SDPA's "
                                    f"{config['backend']} backend refuses this problem"}
        else:
            fns[config_json] = candidate
    timings = measure(fns, n_sets=len(sets), rounds=payload["rounds"],
                      round_ms=payload["round_ms"])
    return {"status": "ok", "timings": {**{k: _timing_reply(timings[k], payload["device"])
                                           for k in fns}, **refused}}


def task_baselines(payload: dict[str, Any]) -> dict[str, Any]:
    """Every SDPA backend that accepts the problem, timed together."""
    from .timing import measure

    problem = Problem(**payload["problem"])
    sets = problem_inputs(problem)
    per_set = problem_sdpa(problem)
    names = sorted(set.intersection(*(set(b) for b in per_set)))
    fns = {name: (lambda i, name=name: per_set[i][name]()) for name in names}
    timings = measure(fns, n_sets=len(sets), rounds=payload["rounds"],
                      round_ms=payload["round_ms"])
    return {"status": "ok",
            "timings": {k: _timing_reply(t, payload["device"]) for k, t in timings.items()}}


def task_device_info(payload: dict[str, Any]) -> dict[str, Any]:
    import torch

    from .environment import driver_version

    props = torch.cuda.get_device_properties(payload["device"])
    driver = driver_version()
    return {"status": "ok", "name": props.name,
            "compute_capability": props.major * 10 + props.minor,
            "sm_count": props.multi_processor_count, "driver_version": driver,
            "cuda_version": str(torch.version.cuda),
            "max_smem_per_block": int(getattr(props, "shared_memory_per_block_optin", 0))}


for _name, _fn in (("validate", task_validate), ("trial", task_trial), ("rerank", task_rerank),
                   ("baselines", task_baselines), ("device_info", task_device_info)):
    register_task(_name, _fn)
