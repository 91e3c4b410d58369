"""Work a GPU worker process does for a tuning session: validate and time one trial, re-time a
few finalists interleaved, time torch SDPA's backends, describe the device.

Runs only inside `worker.GpuWorker` processes. Input tensors of a problem are generated once per
process and reused by every trial and baseline of that problem, so all candidates and SDPA see
the same data; there are enough input sets to rotate through 3x the L2 cache.
"""

from __future__ import annotations

import math
from typing import Any

from .compiler import compile_config
from .config import Config
from .kernel import CompiledKernel
from .problem import Problem
from .sdpa import accepted_backends
from .space import load_space
from .target import Target
from .validate import validate
from .worker import register_task

_inputs: dict[Problem, list[tuple[Any, ...]]] = {}
# Validation verdicts of this process by cubin: a config tuned for many shapes of one problem
# class is the same binary on the same GPU, validated once (the validator's cases do not depend
# on the tuning shape; the output at the tuning shape is still compared with SDPA every trial).
_validated: dict[str, tuple[bool, str, float]] = {}


def problem_inputs(problem: Problem) -> list[tuple[Any, ...]]:
    import torch

    from .tensors import torch_dtype
    from .timing import input_sets_needed

    if problem not in _inputs:
        _inputs.clear()  # one problem at a time keeps device memory bounded
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


def _reference_output(problem: Problem) -> Any:
    sets = problem_inputs(problem)
    call = accepted_backends(*sets[0][:3], causal=problem.causal)["default"]
    return call().float()


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


def task_trial(payload: dict[str, Any]) -> dict[str, Any]:
    """Validate one config (full validator) then time it on the problem."""
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
    timing = measure({name: lambda i: kernel(*sets[i][:3], out=sets[i][3])}, n_sets=len(sets),
                     rounds=payload["rounds"], round_ms=payload["round_ms"])[name]
    return {**result, "median_us": timing.median_us, "p20_us": timing.p20_us,
            "p80_us": timing.p80_us, "rounds": timing.rounds}


def _sdpa_calls(problem: Problem, sets: list[tuple[Any, ...]]) -> dict[str, Any]:
    """torch SDPA's backends that accept the problem, as timing candidates over the sets."""
    per_set = [accepted_backends(*s[:3], causal=problem.causal) for s in sets]
    names = set.intersection(*(set(b) for b in per_set))
    return {name: (lambda i, name=name: per_set[i][name]()) for name in sorted(names)}


def task_rerank(payload: dict[str, Any]) -> dict[str, Any]:
    """Re-time several already-validated configs, interleaved round by round; with
    `with_sdpa`, torch SDPA's backends take part in the same rounds, so the speed-up stored
    with the winner compares two kernels timed in one run, not minutes apart."""
    from .timing import measure

    problem = Problem(**payload["problem"])
    sets = problem_inputs(problem)
    fns = {}
    for config_json in payload["configs"]:
        _, kernel = _kernel(config_json, payload["target"], payload["device"])
        fns[config_json] = (lambda i, kernel=kernel: kernel(*sets[i][:3], out=sets[i][3]))
    # A config's key is its JSON object text, so it cannot collide with a backend's name.
    sdpa = _sdpa_calls(problem, sets) if payload.get("with_sdpa") else {}
    timings = measure({**fns, **sdpa}, n_sets=len(sets), rounds=payload["rounds"],
                      round_ms=payload["round_ms"])
    return {"status": "ok",
            "timings": {k: timings[k].as_dict() for k in fns},
            "baselines": {k: timings[k].as_dict() for k in sdpa}}


def task_baselines(payload: dict[str, Any]) -> dict[str, Any]:
    from .timing import measure

    problem = Problem(**payload["problem"])
    sets = problem_inputs(problem)
    timings = measure(_sdpa_calls(problem, sets), n_sets=len(sets), rounds=payload["rounds"],
                      round_ms=payload["round_ms"])
    return {"status": "ok", "timings": {k: t.as_dict() for k, t in timings.items()}}


def task_device_info(payload: dict[str, Any]) -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(payload["device"])
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else str(driver)
    except Exception:  # noqa: BLE001 - NVML is optional; the CUDA driver version will do
        version = torch._C._cuda_getDriverVersion()  # type: ignore[attr-defined]
        driver = f"cuda-driver-{version // 1000}.{(version % 1000) // 10}"
    return {"status": "ok", "name": props.name,
            "compute_capability": props.major * 10 + props.minor,
            "sm_count": props.multi_processor_count, "driver_version": driver,
            "cuda_version": str(torch.version.cuda),
            "max_smem_per_block": int(getattr(props, "shared_memory_per_block_optin", 0))}


for _name, _fn in (("validate", task_validate), ("trial", task_trial), ("rerank", task_rerank),
                   ("baselines", task_baselines), ("device_info", task_device_info)):
    register_task(_name, _fn)
