"""Attention that autograd differentiates: torch.ops.cute_autotune.attention_train (the forward,
which keeps its log-sum-exp for the backward) and torch.ops.cute_autotune.attention_backward
(a config of the backward family), with the backward registered on the forward op, so eager
calls and torch.compile's traces take the same path.

Which backward runs is decided per problem (by its length class) and GPU, `backward_config`,
from the tuning database as the forward's is: a backward problem (`Problem.backward`) tuned
beside torch's backward has its re-ranking's winner, one not tuned that of the nearest tuned
backward problem of its class; where the winner is torch's backward, or the database knows no
backward problem of the class, the call stays on torch SDPA, forward and backward (no-regret:
torch's backward is the one measured), except under `untuned="kernel"` (`configure`), which
runs the family's default where nothing was tuned.

(No `from __future__ import annotations` here: torch.library reads the annotations at runtime.)
"""

import math
import threading
from dataclasses import replace
from typing import Any

import torch

from .._bounded import LruDict
from ..launch.tensors import ALIGN_BYTES, logical_bhld
from ..model.problem import Problem

BACKWARD_FAMILY = "bwd"

_configs: LruDict[tuple[Any, ...], str | None] = LruDict(4096)
_kernels: dict[tuple[str, int], Any] = {}
_lock = threading.Lock()


def backward_config(
    problem: Problem, device_index: int, *, deterministic: bool = False
) -> str | None:
    """The backward config (its JSON) that runs `problem`'s gradients on GPU `device_index`,
    or None where torch's backward runs them (a head dim the family lacks, a GPU it does not
    fit, or a dispatcher that only runs what was measured faster). `deterministic`, or
    torch.use_deterministic_algorithms(True): only a deterministic backward (bit-identical
    gradients) may run."""
    from .attention import dispatcher, generation

    chosen = dispatcher()
    deterministic = deterministic or torch.are_deterministic_algorithms_enabled()
    key = (problem, deterministic, device_index, generation())
    if key in _configs:
        return _configs[key]
    answer = None
    tuned = chosen.tuned_backward(
        replace(problem, backward=True, deterministic=deterministic), device_index
    )
    if tuned is not None:
        answer = _runnable(tuned[0], device_index, deterministic)
    elif chosen.untuned == "kernel":
        from ..model.space import load_space
        from ..model.target import target_for_device

        space = load_space(BACKWARD_FAMILY)
        values: dict[str, int | bool | str] = {
            "head_dim": problem.head_dim,
            "dtype": problem.dtype,
            "causal": problem.causal,
            "deterministic": deterministic,
        }
        if problem.head_dim in space.params["head_dim"].values:
            config = space.heuristic(values)
            target = target_for_device(device_index)
            if config is not None and space.supports(target.cc):
                if not space.violations(config, target):
                    answer = config.to_json()
    _configs[key] = answer
    return answer


def _runnable(config: Any, device_index: int, deterministic: bool) -> str | None:
    """A tuned backward winner as `backward_config` answers it: a backward config of the mode
    asked for that this GPU runs (its JSON), else None (torch's backward won, or the config
    cannot run here)."""
    from ..model.space import BACKWARD, load_space
    from ..model.target import target_for_device

    space = load_space(config.family)
    if space.direction != BACKWARD or not space.compiled:
        return None
    if bool(config["deterministic"]) != deterministic:
        return None
    target = target_for_device(device_index)
    if not space.supports(target.cc) or space.violations(space.validate(config), target):
        return None
    result: str = config.to_json()
    return result


def _compiled(config_json: str, device_index: int) -> Any:
    """The loaded backward kernel of a config: cache, kernel pack, or nvcc now."""
    key = (config_json, device_index)
    kernel = _kernels.get(key)
    if kernel is not None:
        return kernel
    from ..build.obtain import obtain
    from ..launch.backward import CompiledBackward
    from ..model.config import Config
    from ..model.space import validate_config
    from ..model.target import target_for_device
    from .attention import dispatcher

    valid = validate_config(Config.from_json(config_json))
    build = obtain(
        valid, target_for_device(device_index), compile_on_miss=dispatcher().compile_on_miss
    )
    if not build.ok:
        raise RuntimeError(f"cute-autotune: the backward config has no build: {build.message}")
    with _lock:
        kernel = _kernels.setdefault(key, CompiledBackward(build, device_index))
    return kernel


def _operand_ready(t: torch.Tensor) -> torch.Tensor:
    """`t` as the kernels take it (contiguous head dim, 16-byte aligned pointer and strides),
    copied only where it is not: autograd hands an upstream gradient in any layout (a sum's is
    expanded with stride 0)."""
    elem = t.element_size()
    if (
        t.stride(-1) == 1
        and not t.data_ptr() % ALIGN_BYTES
        and not any((s * elem) % ALIGN_BYTES for s in t.stride()[:-1])
        and all(s > 0 for s in t.stride()[:-1])
    ):
        return t
    return t.contiguous()


@torch.library.custom_op("cute_autotune::attention_train", mutates_args=())
def attention_train(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    layout: str,
    backward: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of attention; its gradients by the backward config `backward` (JSON)."""
    from .attention import _eager

    out, lse = _eager(
        q.detach(),
        k.detach(),
        v.detach(),
        causal=causal,
        scale=scale,
        return_lse=True,
        layout=layout,
        strict=False,
    )
    return out, lse.contiguous()


@attention_train.register_fake
def _(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    scale: float,
    layout: str,
    backward: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    qb = logical_bhld(q, layout)
    lse = q.new_empty((qb.shape[0], qb.shape[1], qb.shape[2]), dtype=torch.float32)
    return torch.empty_like(q), lse


@torch.library.custom_op("cute_autotune::attention_backward", mutates_args=())
def attention_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
    layout: str,
    backward: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of attention_train's output for the upstream gradient `dout`."""
    kernel = _compiled(backward, q.device.index or 0)
    ready = [_operand_ready(t) for t in (q, k, v, out, dout)]
    dq, dk, dv = kernel(*ready, lse, scale=scale, layout=layout)
    return dq, dk, dv


@attention_backward.register_fake
def _(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    scale: float,
    layout: str,
    backward: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    q, k, v, causal, scale, layout, backward = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.scale, ctx.layout, ctx.backward = causal, scale, layout, backward
    ctx.mark_non_differentiable(lse)


def _backward(ctx: Any, dout: torch.Tensor, dlse: Any) -> tuple[Any, ...]:
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.cute_autotune.attention_backward(
        dout, q, k, v, out, lse, ctx.causal, ctx.scale, ctx.layout, ctx.backward
    )
    return dq, dk, dv, None, None, None, None


torch.library.register_autograd(
    "cute_autotune::attention_train", _backward, setup_context=_setup_context
)


def gradient_problem(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, layout: str
) -> Problem | None:
    """The problem of a call whose inputs require grad, where a backward kernel could serve it
    (CUDA, fp16 or bf16; shapes already checked); None elsewhere. Reads no data pointer, so it
    also answers for the fake tensors of a torch.compile trace."""
    from ..launch.tensors import problem_of

    names = {torch.float16: "fp16", torch.bfloat16: "bf16"}
    if q.device.type != "cuda" or q.dtype not in names:
        return None
    return problem_of(q, k, dtype=names[q.dtype], causal=causal, layout=layout)


def differentiable_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float | None,
    layout: str,
    backward: str,
) -> torch.Tensor:
    """attention_train's output: what `attention()` returns for inputs that require grad when
    a backward config serves them."""
    head_dim = logical_bhld(q, layout).shape[3]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    out, _ = torch.ops.cute_autotune.attention_train(q, k, v, causal, scale, layout, backward)
    result: torch.Tensor = out
    return result
