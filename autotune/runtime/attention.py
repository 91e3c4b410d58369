"""`autotune.attention`: a drop-in for torch's scaled_dot_product_attention forward that runs the
tuned CuTe kernel for the GPU and shape at hand.

Misuse raises a ValueError (InputError) naming the argument, whichever path would run: an
argument that is not a tensor, a dtype attention is not defined in (integers, bool, complex,
float8), a scale that is not a finite number > 0, a flag that is not a bool, inconsistent shapes,
Hq % Hkv != 0, mixed devices or dtypes, an unknown layout. Inputs that are valid attention but
that the kernels cannot run (CPU tensors, fp32, an unsupported head dim, a non-contiguous head
dimension, misaligned pointers or strides, inputs that require grad, an old GPU, no kernel for
the problem) go to torch SDPA with a warning, once per reason; `strict=True` or
CUTE_AUTOTUNE_STRICT=1 raises instead. Misaligned CUDA inputs are copied to aligned memory
before SDPA sees them (torch 2.11's default backend returned wrong results for such a view and
broke the CUDA context).

Safe to call from several threads: the dispatcher, the launcher, the per-geometry memo and the
loaded cubins are each made once under a lock.

It is also the custom op `torch.ops.cute_autotune.attention` with a fake implementation, so
torch.compile(fullgraph=True) traces through it, and it can be captured in CUDA graphs (after a
first call outside the capture has made the per-problem decision).
"""

from __future__ import annotations

import math
import numbers
import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from typing import TYPE_CHECKING, Any

from .._bounded import LruDict
from .._shown import shown
from ..launch.kernel import PreparedLaunch
from ..launch.tensors import ALIGN_BYTES, InputError, check_shapes, logical_bhld, problem_of
from ..measure.sdpa import sdpa_switches
from ..model.buckets import length_class, representative
from ..model.problem import Problem
from ..model.space import families, load_space
from .dispatch import (
    EXACT,
    FALLBACK,
    MEMO_SIZE,
    UNTUNED_ENV,
    Decision,
    Dispatcher,
    device_info,
    with_prediction,
)
from .misses import MissRecorder

if TYPE_CHECKING:
    import torch

STRICT_ENV = "CUTE_AUTOTUNE_STRICT"
COMPILE_ENV = "CUTE_AUTOTUNE_COMPILE_ON_MISS"
_DTYPES = {"torch.float16": "fp16", "torch.bfloat16": "bf16"}


class Unsupported(RuntimeError):
    """Valid attention that the tuned kernels cannot run (raised in strict mode)."""


_dispatcher: Dispatcher | None = None
_generation = 0
_recorder: MissRecorder | None = None
_warned: set[str] = set()
_lock = threading.Lock()
# Geometries served by torch SDPA as a fallback (no kernel for them), with their miss counter.
_fallback_misses: LruDict[tuple[Any, ...], Any] = LruDict(MEMO_SIZE)


@dataclass(frozen=True)
class _Prepared:
    """Everything a repeated call needs: the launcher's plan and the output's geometry, or
    the torch SDPA backend that won this problem."""

    kernel: PreparedLaunch | None  # the tuned kernel's launch; None for torch SDPA
    sdpa: _SdpaRun | None = None
    miss: Any = None  # misses.Miss of a problem served without an exact tuned entry


class _SdpaRun:
    """A torch SDPA backend chosen by dispatch (it won the problem), called with the kwargs
    made once. With return_lse, a torch op of that backend that returns the log-sum-exp
    itself; where none runs the problem, the best kernel of ours (resolved on the first such
    call, then kept)."""

    def __init__(
        self,
        backend: str,
        problem: Problem,
        causal: bool,
        scale: float | None,
        layout: str,
        device_index: int,
        inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        from ..measure.sdpa import backend_call, lower_right_call, sdpa_kwargs

        self.backend, self.problem, self.causal = backend, problem, causal
        self.scale, self.layout, self.device_index = scale, layout, device_index
        self._with_lse: Any = None
        self._lock = threading.Lock()
        # Made once: a decode-sized call runs for microseconds, so the host work per call is
        # kept to the views and torch's own call.
        self._call = self._general = backend_call(
            backend,
            sdpa_kwargs(
                problem.seqlen_q,
                problem.seqlen_k,
                problem.heads_q,
                problem.heads_kv,
                causal=causal,
                scale=scale,
            ),
        )
        # Causal with 1 < Lq != Lk: the op torch's lower-right bias would pick, called without
        # the bias's per-call Python dispatch, while the SDPA switches it was picked under hold.
        self._switches_needed: tuple[bool, ...] | None = None
        lq, lk = problem.seqlen_q, problem.seqlen_k
        if causal and 1 < lq != lk and inputs is not None:
            q, k, v = (logical_bhld(t, layout) for t in inputs)
            direct = lower_right_call(
                backend, q, k, v, scale=scale, enable_gqa=problem.heads_q != problem.heads_kv
            )
            if direct is not None:
                self._call, self._switches_needed = direct

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, return_lse: bool) -> Any:
        if return_lse:
            if self._with_lse is None:
                with self._lock:
                    if self._with_lse is None:
                        self._with_lse = self._resolve_lse(q, k, v)
            return self._with_lse(q, k, v)
        call = self._call
        if self._switches_needed is not None and sdpa_switches() != self._switches_needed:
            call = self._general  # the caller changed torch's SDPA switches: torch decides
        if self.layout == "bhld":
            return call(q, k, v)
        return call(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)

    def _resolve_lse(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
        from ..measure.sdpa import lse_call

        real_scale = (
            1.0 / math.sqrt(self.problem.head_dim) if self.scale is None else float(self.scale)
        )
        call = lse_call(
            self.backend, q, k, v, causal=self.causal, scale=real_scale, layout=self.layout
        )
        if call is not None:
            return call
        decision = dispatcher().kernel_decision(self.problem, self.device_index)
        if decision.kernel is None:
            raise Unsupported(
                f"return_lse=True: no torch op of the {self.backend} backend "
                f"returns the log-sum-exp here, and no kernel runs it: "
                f"{decision.reason}"
            )
        plan = _kernel_plan(decision, q, k, v, self.problem, self.scale, self.layout)

        def with_kernel(q: Any, k: Any, v: Any) -> Any:
            return _run(plan, q, k, v, True)

        return with_kernel


# (shapes, strides, dtype, device, causal, scale, layout) -> _Prepared. Filled on the first call
# of each geometry (its decision from the dispatcher's memo of length classes, its launch plan
# made here); later calls do no checks beyond pointer alignment, no lookup, no I/O. Bounded: the
# least recently used geometries are dropped.
_prepared: LruDict[tuple[Any, ...], _Prepared] = LruDict(MEMO_SIZE)


def configure(
    *,
    db: str | None = None,
    compile_on_miss: bool | None = None,
    use_shipped: bool = True,
    untuned: str | None = None,
) -> Dispatcher:
    """Replace the process-wide dispatcher (and forget its decisions). `untuned="kernel"`
    runs the kernels' built-in defaults on problems nobody tuned even where no kernel was
    measured faster than torch SDPA (default "measured": SDPA there;
    $CUTE_AUTOTUNE_UNTUNED)."""
    global _dispatcher, _recorder, _generation
    made = _new_dispatcher(db, compile_on_miss, use_shipped, untuned)
    with _lock:
        _dispatcher = made
        _generation += 1
        _prepared.clear()
        _fallback_misses.clear()
        _accepted.clear()
        _lengths_seen.clear()
        old, _recorder = _recorder, None
    if old is not None:
        old.close()  # the counts so far go to the database they were counted for
    return made


def generation() -> int:
    """How many times `configure` replaced the dispatcher: what memos of its decisions kept
    elsewhere key on (a number, not the dispatcher, so an old one and its database engine are
    not kept alive)."""
    return _generation


def recorder() -> MissRecorder:
    """The process's counter of runtime misses, writing to the dispatcher's database."""
    global _recorder
    if _recorder is None:
        with _lock:
            if _recorder is None:
                _recorder = MissRecorder(lambda: dispatcher().store())
    return _recorder


def _miss(decision: Decision, device_index: int, problem: Problem | None = None) -> Any:
    """The miss counter of a decision that is not an exact tuned entry (None for one that is,
    or when recording is off), counted for the problem it was decided for (a length class's
    representative: what tuning would cover the class with) or `problem`."""
    if decision.path == EXACT:
        return None
    problem = problem or decision.decided_for
    if problem is None:
        return None
    path = f"{decision.path}:sdpa" if decision.sdpa_backend else decision.path
    try:
        return recorder().miss(device_info(device_index), problem, path)
    except Exception:  # noqa: BLE001 - counting must never stop attention
        return None


def _new_dispatcher(
    db: str | None = None,
    compile_on_miss: bool | None = None,
    use_shipped: bool = True,
    untuned: str | None = None,
) -> Dispatcher:
    if compile_on_miss is None:
        compile_on_miss = os.environ.get(COMPILE_ENV, "1") != "0"
    if untuned is None:
        untuned = os.environ.get(UNTUNED_ENV, "measured") or "measured"
    return Dispatcher(
        db, compile_on_miss=compile_on_miss, use_shipped=use_shipped, untuned=untuned
    )


def dispatcher() -> Dispatcher:
    global _dispatcher
    if _dispatcher is None:
        with _lock:  # the first calls of several threads make one dispatcher, not one each
            if _dispatcher is None:
                _dispatcher = _new_dispatcher()
    return _dispatcher


def _strict(strict: bool | None) -> bool:
    return strict if strict is not None else os.environ.get(STRICT_ENV, "0") not in ("", "0")


@cache
def _head_dims() -> tuple[int, ...]:
    """The head dims some kernel family has (dispatch then finds one that runs on the GPU)."""
    return tuple(
        sorted({int(d) for f in families() for d in load_space(f).params["head_dim"].values})
    )


@cache
def _tensor_types() -> tuple[type[torch.Tensor], frozenset[torch.dtype]]:
    """torch.Tensor, and the dtypes attention is defined in (torch SDPA's; fp16 and bf16 also
    run the kernels)."""
    import torch

    return torch.Tensor, frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))


def check_arguments(
    q: Any, k: Any, v: Any, *, causal: Any, scale: Any = None, return_lse: Any = False
) -> None:
    """The one check of `attention`'s arguments, made before either path (the tuned kernels
    or torch SDPA) sees them; InputError names the argument."""
    tensor, dtypes = _tensor_types()
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, tensor):
            raise InputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in dtypes:
            raise InputError(
                f"{name} has dtype {t.dtype}; attention needs float16, bfloat16, "
                "float32 or float64"
            )
    for name, flag in (("causal", causal), ("return_lse", return_lse)):
        if flag is not True and flag is not False:
            raise InputError(f"{name} must be True or False, got {flag!r}")
    if scale is not None and not valid_scale(scale):
        raise InputError(
            f"scale must be a finite number > 0 (None: 1/sqrt(head dim)), got {shown(scale)}"
        )


def valid_scale(scale: Any) -> bool:
    """Whether `scale` is a real number (not a bool) whose float is finite and > 0. A number
    no float holds (10**400, a Fraction as large) or one that rounds to 0 is not: the test never
    raises, whatever the number."""
    if type(scale) is float:  # the common case, without the ABC check
        return 0.0 < scale < math.inf
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        return False
    try:
        value = float(scale)
    except (OverflowError, ValueError, TypeError, ZeroDivisionError):
        return False
    return 0.0 < value < math.inf


def read_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, layout: str
) -> tuple[Problem | None, str | None]:
    """(problem, None) when the kernels can run it, (problem or None, reason) when they cannot.
    Raises ValueError for inputs that are not valid attention at all."""
    check_shapes(q, k, v, layout)
    qb, kb, vb = (logical_bhld(t, layout) for t in (q, k, v))
    dtype = _DTYPES.get(str(q.dtype))
    if q.device.type != "cuda":
        return None, f"tensors are on {q.device}; the kernels run on CUDA GPUs"
    if dtype is None:
        return None, f"dtype {q.dtype} is not supported (fp16 and bf16 are)"
    problem = problem_of(q, k, dtype=dtype, causal=causal, layout=layout)
    head_dims = _head_dims()
    if problem.head_dim not in head_dims:
        return problem, f"head dim {problem.head_dim} is not one of {list(head_dims)}"
    if (q.requires_grad or k.requires_grad or v.requires_grad) and not _backward_serves(
        problem, q.device.index or 0
    ):
        return problem, "an input requires grad and no backward config serves the problem"
    elem = q.element_size()
    for name, t in (("q", qb), ("k", kb), ("v", vb)):
        if t.stride(3) != 1:
            return problem, f"{name}'s head dimension is not contiguous"
        if t.data_ptr() % ALIGN_BYTES or any((s * elem) % ALIGN_BYTES for s in t.stride()[:3]):
            return problem, f"{name}'s data pointer or strides are not {ALIGN_BYTES}-byte aligned"
    return problem, None


def _backward_serves(problem: Problem, device_index: int) -> bool:
    """Whether attention()'s gradients of `problem` would run a backward kernel."""
    import torch

    from .training import backward_config

    return torch.is_grad_enabled() and backward_config(problem, device_index) is not None


def _fallback(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float | None,
    layout: str,
    return_lse: bool,
    reason: str,
    strict: bool,
) -> Any:
    if strict:
        raise Unsupported(f"cute-autotune cannot run this attention: {reason} (strict mode)")
    key = reason.split(":")[0]
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"cute-autotune: falling back to torch SDPA: {reason}", stacklevel=3)
    from ..measure.sdpa import sdpa_call

    q, k, v = (_aligned(t) for t in (q, k, v))

    out = sdpa_call("default", q, k, v, causal=causal, scale=scale, layout=layout)()
    out = out if layout == "bhld" else out.transpose(1, 2)
    if not return_lse:
        return out
    from ..measure.sdpa import fallback_lse

    lse = fallback_lse(
        q.detach(),
        k.detach(),
        v.detach(),
        causal=causal,
        scale=scale if scale is not None else 1 / math.sqrt(q.shape[-1]),
        layout=layout,
    )
    return out, lse


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a dense copy of it when its data pointer or a stride is not 16-byte aligned: no
    SDPA backend is handed memory it may mishandle (a copy keeps autograd's graph)."""
    if t.device.type != "cuda":
        return t
    elem = t.element_size()
    if not t.data_ptr() % ALIGN_BYTES and (
        t.is_contiguous()
        or (t.stride(-1) == 1 and not any((s * elem) % ALIGN_BYTES for s in t.stride()[:-1]))
    ):
        return t
    import torch

    return t.clone(memory_format=torch.contiguous_format)


def _run(
    prepared: _Prepared, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, return_lse: bool
) -> Any:
    if prepared.sdpa is not None:
        return prepared.sdpa(q, k, v, return_lse)
    assert prepared.kernel is not None
    out, lse = prepared.kernel.run(q, k, v, return_lse=return_lse)
    return (out, lse) if return_lse else out


# torch's default SDPA builds an execution plan per new key length for a decode-sized call
# (cuDNN's path with a split reduction, which it picks for contiguous inputs): the fastest call
# at a length it has seen, but each new length costs tens of milliseconds, and a KV cache
# growing by a token per step meets a new length at every step. A geometry seen growing goes
# to the first of PLAN_FREE that takes its inputs (cuDNN named alone runs another kernel, with
# no plan per length); one seen at a single length keeps torch's choice.
PLAN_FREE = ("cudnn", "flash", "efficient")
DECODE_LQ = 16  # the largest query length counted as a decode step (measure.sdpa.sdpa_path)
# geometry without Lk -> {length class of Lk: the first Lk seen in it} (bounded)
_lengths_seen: LruDict[tuple[Any, ...], dict[int, int]] = LruDict(MEMO_SIZE)


def seen_growing(geometry: tuple[Any, ...], seqlen_k: int) -> bool:
    """Whether calls of `geometry` (everything but the key length) have now met two key lengths
    in one length class: a cache growing step by step, not problems of a few fixed lengths
    (which rarely fall within one class, about 9% wide)."""
    seen = _lengths_seen.get(geometry)
    if seen is None:
        _lengths_seen[geometry] = seen = {}
    first = seen.setdefault(length_class(seqlen_k), seqlen_k)
    return first != seqlen_k or len(seen) > 1 and _adjacent(seen, seqlen_k)


def _adjacent(seen: dict[int, int], seqlen_k: int) -> bool:
    """A length first seen in its class while the class below it was seen: the cache grew into
    a new class."""
    return length_class(seqlen_k) - 1 in seen


def sdpa_route(backend: str, seqlen_q: int, growing: bool, accepts: Callable[[str], bool]) -> str:
    """The torch SDPA backend a call dispatch gave to `backend` runs on: a decode-sized call
    (Lq <= DECODE_LQ) given to torch's default whose geometry is `growing` goes to the first
    of PLAN_FREE that `accepts` the inputs; anything else, or where none accepts, stays."""
    if backend != "default" or seqlen_q > DECODE_LQ or not growing:
        return backend
    return next((other for other in PLAN_FREE if accepts(other)), backend)


def _prepare(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float | None,
    layout: str,
) -> tuple[_Prepared | None, str]:
    """Decide for this geometry and build its launch plan; (None, reason) if it cannot run."""

    problem, reason = read_inputs(q, k, v, causal=causal, layout=layout)
    if reason is not None or problem is None:
        return None, reason or "unsupported"
    device_index = q.device.index or 0
    decision = dispatcher().decide(problem, device_index)
    if decision.sdpa_backend is not None:
        backend = decision.sdpa_backend
        if not _accepts(backend, q, k, v, causal=causal, scale=scale, layout=layout):
            backend = "default"  # a stored backend this torch refuses: torch's own choice
        if backend == "default" and problem.seqlen_q <= DECODE_LQ:
            lk_dim = 2 if layout == "bhld" else 1
            # what does not move as a cache grows (a new tensor's batch stride does)
            geometry = (
                q.shape,
                q.stride(),
                k.shape[:lk_dim],
                k.shape[lk_dim + 1 :],
                _alignment(k),
                _alignment(v),
                q.dtype,
                q.device,
                causal,
                scale,
                layout,
            )
            backend = sdpa_route(
                backend,
                problem.seqlen_q,
                seen_growing(geometry, problem.seqlen_k),
                lambda other: _accepts(other, q, k, v, causal=causal, scale=scale, layout=layout),
            )
        run = _SdpaRun(backend, problem, causal, scale, layout, device_index, (q, k, v))
        return _Prepared(None, run, _miss(decision, device_index)), ""
    if decision.kernel is None:
        return None, decision.reason
    plan = _kernel_plan(decision, q, k, v, problem, scale, layout)
    return replace(plan, miss=_miss(decision, device_index)), ""


# Whether a torch SDPA backend runs inputs of a kind, keyed by their length classes, not their
# lengths (bounded): the check is a real call, and a cache growing by a token per step would
# otherwise pay it, a second attention call, at every step.
_accepted: LruDict[tuple[Any, ...], bool] = LruDict(MEMO_SIZE)


def _accepts(
    backend: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float | None,
    layout: str,
) -> bool:
    """Whether torch SDPA's `backend` runs these inputs (one call, made once per kind of
    input and length class)."""
    from ..measure.sdpa import sdpa_call

    if backend == "default":
        return True
    lq, lk = q.shape[2 if layout == "bhld" else 1], k.shape[2 if layout == "bhld" else 1]
    key = (
        backend,
        sdpa_switches(),
        q.dtype,
        q.device,
        layout,
        causal,
        scale,
        length_class(lq),
        length_class(lk),
        (lq > lk) - (lq < lk),
        *(t.shape[:2] if layout == "bhld" else (t.shape[0], t.shape[2]) for t in (q, k)),
        q.shape[-1],
        *(_alignment(t) for t in (q, k, v)),
    )
    known = _accepted.get(key)
    if known is not None:
        return known
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            sdpa_call(backend, q, k, v, causal=causal, scale=scale, layout=layout)()
            accepted = True
        except RuntimeError:
            accepted = False
    _accepted[key] = accepted
    return accepted


def _alignment(t: torch.Tensor) -> tuple[int, ...]:
    """What of a tensor's placement a backend's checks read: its data pointer's and each
    stride's alignment in bytes (up to 16) and whether the last dimension is contiguous."""
    elem = t.element_size()
    return (
        math.gcd(t.data_ptr(), ALIGN_BYTES),
        t.stride(-1) == 1,
        *(math.gcd(s * elem, ALIGN_BYTES) for s in t.stride()),
    )


def _kernel_plan(
    decision: Decision,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    problem: Problem,
    scale: float | None,
    layout: str,
) -> _Prepared:
    assert decision.kernel is not None
    # A decode config launches with its tuned KV split count (its own), any other with 1.
    return _Prepared(decision.kernel.prepare(problem, q, k, v, scale=scale, layout=layout))


def _eager(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float | None,
    return_lse: bool,
    layout: str,
    strict: bool | None,
    unsupported: Callable[[str], Any] | None = None,
    deterministic: bool = False,
) -> Any:
    """`attention` without the compile check; `unsupported(reason)`, when given, answers the
    inputs no kernel can run in place of the warned torch SDPA fallback (the SDPA drop-in
    calls torch's own function with the caller's arguments there)."""
    try:
        key = (
            q.shape,
            q.stride(),
            k.shape,
            k.stride(),
            v.shape,
            v.stride(),
            q.dtype,
            q.device,
            causal,
            scale,
            layout,
        )
        prepared = _prepared.get(key)
    except (AttributeError, TypeError):  # not tensors: check_arguments below says which
        prepared = None
    # A memo hit stands for arguments checked when it was made (the key pins the dtypes, the
    # scale and the shapes); only what the key does not pin is checked again.
    if (
        prepared is not None
        and (causal is True or causal is False)
        and (return_lse is True or return_lse is False)
        and not (q.requires_grad or k.requires_grad or v.requires_grad)
        and not (q.data_ptr() | k.data_ptr() | v.data_ptr()) % ALIGN_BYTES
    ):
        if prepared.miss is not None:
            prepared.miss.calls += 1
        return _run(prepared, q, k, v, return_lse)
    check_arguments(q, k, v, causal=causal, scale=scale, return_lse=return_lse)
    scale = None if scale is None else float(scale)  # a numpy number, a Fraction: torch's type
    if not return_lse and _needs_grad(q, k, v):
        differentiated = _with_backward(
            q, k, v, causal=causal, scale=scale, layout=layout, deterministic=deterministic
        )
        if differentiated is not None:
            return differentiated
    reason = ""
    if (
        q.dim() == 4
        and q.device.type == "cuda"
        and not (q.requires_grad or k.requires_grad or v.requires_grad)
    ):
        prepared, reason = _prepare(q, k, v, causal=causal, scale=scale, layout=layout)
        if prepared is not None:
            _prepared[key] = prepared
            if prepared.miss is not None:
                prepared.miss.calls += 1
            return _run(prepared, q, k, v, return_lse)
        _count_fallback(key, q, k, v, causal=causal, layout=layout)
    else:
        _, why = read_inputs(q, k, v, causal=causal, layout=layout)
        reason = why or "unsupported"
    if unsupported is not None:
        return unsupported(reason)
    return _fallback(
        q,
        k,
        v,
        causal=causal,
        scale=scale,
        layout=layout,
        return_lse=return_lse,
        reason=reason,
        strict=_strict(strict),
    )


def _needs_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    import torch

    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def _with_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float | None,
    layout: str,
    deterministic: bool = False,
) -> torch.Tensor | None:
    """The output of attention that our backward differentiates, or None where torch's
    backward is the one to run (training.backward_config)."""
    from .training import backward_config, differentiable_attention, gradient_problem

    problem = gradient_problem(q, k, v, causal=causal, layout=layout)
    if problem is None:
        return None
    backward = backward_config(problem, q.device.index or 0, deterministic=deterministic)
    if backward is None:
        return None
    return differentiable_attention(
        q, k, v, causal=causal, scale=scale, layout=layout, backward=backward
    )


def _count_fallback(
    key: tuple[Any, ...],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    layout: str,
) -> None:
    """Count a call of a CUDA problem that no kernel serves (it runs torch SDPA)."""
    if key not in _fallback_misses:
        problem, _ = read_inputs(q, k, v, causal=causal, layout=layout)
        _fallback_misses[key] = (
            _miss(Decision(FALLBACK, ""), q.device.index or 0, representative(problem))
            if problem is not None
            else None
        )
    miss = _fallback_misses[key]
    if miss is not None:
        miss.calls += 1


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    layout: str = "bhld",
    strict: bool | None = None,
    deterministic: bool = False,
) -> Any:
    """softmax(scale * Q K^T [+ causal mask]) V.

    q: [B, Hq, Lq, D], k and v: [B, Hkv, Lk, D] (layout="bhld"), or [B, L, H, D]
    (layout="blhd"), no copy either way. Hq must be a multiple of Hkv (GQA / MQA). Causal is
    aligned bottom-right when Lq != Lk. Returns out (the layout of q), and with return_lse the
    fp32 log-sum-exp [B, Hq, Lq] too.

    Inputs that require grad: where a backward config serves the problem
    (`runtime.training.backward_config`), the kernels' forward keeps its LSE and the backward
    family computes dq, dk, dv; elsewhere (and with return_lse) torch SDPA runs forward and
    backward. deterministic=True (or torch.use_deterministic_algorithms(True)): only a backward
    whose gradients are bit-identical from run to run.
    """
    import torch

    if torch.compiler.is_compiling():
        strict_mode = _strict(strict)
        check_arguments(q, k, v, causal=causal, scale=scale, return_lse=return_lse)
        scale = None if scale is None else float(scale)
        if not return_lse and _needs_grad(q, k, v):
            differentiated = _with_backward(
                q, k, v, causal=causal, scale=scale, layout=layout, deterministic=deterministic
            )
            if differentiated is not None:
                return differentiated
        out, lse = torch.ops.cute_autotune.attention(
            q, k, v, causal, scale, return_lse, layout, strict_mode
        )
        return (out, lse) if return_lse else out
    # strict mode matters only where the call falls back: read there ($CUTE_AUTOTUNE_STRICT
    # costs the host an environment lookup per call otherwise)
    return _eager(
        q,
        k,
        v,
        causal=causal,
        scale=scale,
        return_lse=return_lse,
        layout=layout,
        strict=strict,
        deterministic=deterministic,
    )


def explain(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    layout: str = "bhld",
) -> Decision:
    """What `attention` would run for these inputs, and why (with what the performance model
    shipped for the GPU predicts of it, where one ships)."""
    check_arguments(q, k, v, causal=causal)
    problem, reason = read_inputs(q, k, v, causal=causal, layout=layout)
    if reason is not None or problem is None:
        return Decision(FALLBACK, reason or "unsupported")
    index = q.device.index or 0
    made = dispatcher()
    return with_prediction(made.decide(problem, index), problem, device_info(index), made.store())


from . import op as _op  # noqa: E402,F401  registers torch.ops.cute_autotune.attention
from . import training as _training  # noqa: E402,F401  registers attention_train and its backward
