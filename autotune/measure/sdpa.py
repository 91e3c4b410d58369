"""torch's scaled_dot_product_attention as the baseline, per backend, on our problem contract.

Every stored result carries its speed-up over SDPA measured on the same inputs in the same run:
the default choice (cuDNN's Hopper kernel on an H200) and each backend that accepts the problem
(FLASH = FlashAttention-2's sm80 path, EFFICIENT, CUDNN). Causal is bottom-right aligned as in
our kernels: `is_causal=True` when Lq == Lk, else torch's lower-right causal bias.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._bounded import LruDict
from ..launch.tensors import logical_bhld

if TYPE_CHECKING:
    import torch

BACKENDS = ("default", "flash", "efficient", "cudnn")


# torch's switches of its SDPA backends, in one order: (flash, mem_efficient, math, cudnn,
# overrideable). `sdpa_kernel` flips the same switches through a context manager that costs
# about 20 us of host time per call (torch 2.13 on this project's CPU), more than a decode-sized
# kernel runs; these are flipped directly (about 2 us), as global as torch's own.
_SWITCHES = ("flash", "mem_efficient", "math", "cudnn", "overrideable")
_ONLY = {
    "flash": (True, False, False, False, False),
    "efficient": (False, True, False, False, False),
    "cudnn": (False, False, False, True, False),
}


# lower_right_call's choice per kind of input (bounded: least recently used go first)
_RESOLVED: LruDict[tuple[Any, ...], str] = LruDict(1024)


def sdpa_switches() -> tuple[bool, ...]:
    import torch

    return (
        torch._C._get_flash_sdp_enabled(),
        torch._C._get_mem_efficient_sdp_enabled(),
        torch._C._get_math_sdp_enabled(),
        torch._C._get_cudnn_sdp_enabled(),
        torch._C._get_overrideable_sdp_enabled(),
    )


def _set_switches(values: tuple[bool, ...]) -> None:
    import torch

    for name, value in zip(_SWITCHES, values, strict=True):
        getattr(torch._C, f"_set_sdp_use_{name}")(value)


def sdpa_kwargs(
    lq: int,
    lk: int,
    heads_q: int,
    heads_kv: int,
    *,
    causal: bool,
    scale: float | None,
    mask: torch.Tensor | None = None,
) -> dict[str, Any]:
    """The keyword arguments of F.scaled_dot_product_attention for our problem contract; a
    `mask` (boolean, True = attend) replaces the causal one and must include it. A causal
    single-query problem gets no mask: aligned bottom-right, its one row sees every key, and
    torch's lower-right bias would send the call through Python dispatch code that takes the
    host longer than a decode step takes the GPU."""
    kwargs: dict[str, Any] = {"scale": scale}
    if heads_q != heads_kv:
        kwargs["enable_gqa"] = True
    if mask is not None:
        kwargs["attn_mask"] = mask
    elif causal and lq == lk:
        kwargs["is_causal"] = True
    elif causal and lq > 1:
        from torch.nn.attention.bias import causal_lower_right

        kwargs["attn_mask"] = causal_lower_right(lq, lk)
    return kwargs


def sdpa_path(
    lq: int, lk: int, heads_q: int, heads_kv: int, *, causal: bool, kv_cache: str = "dense"
) -> tuple[str, bool, bool, str]:
    """What decides which way torch SDPA runs a problem on our contract (`sdpa_kwargs`): the
    mask it is handed (none, `is_causal` on a square problem, the lower-right causal bias, or
    that bias with more queries than keys, whose first rows see no key), whether it needs
    `enable_gqa`, whether it is a decode-sized call (Lq <= 16), and how the keys are held. A
    timing of SDPA on one problem says something of another only where these agree."""
    if not causal or (lq == 1 and lk > 1):  # one query, bottom-right: it sees every key
        mask = "none"
    elif lq == lk:
        mask = "is_causal"
    else:
        mask = "lower-right" if lq < lk else "lower-right, Lq > Lk"
    return mask, heads_q != heads_kv, lq <= 16, kv_cache


def backend_call(backend: str, kwargs: dict[str, Any]) -> Callable[[Any, Any, Any], Any]:
    """(q, k, v) in [B, H, L, D] -> out through one SDPA backend ("default": torch's choice)."""
    import torch.nn.functional as F

    sdpa = F.scaled_dot_product_attention
    if backend == "default":
        return lambda q, k, v: sdpa(q, k, v, **kwargs)
    only = _ONLY[backend]

    def call(q: Any, k: Any, v: Any) -> Any:
        before = sdpa_switches()
        _set_switches(only)
        try:
            return sdpa(q, k, v, **kwargs)
        finally:
            _set_switches(before)

    return call


def lower_right_call(
    backend: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None,
    enable_gqa: bool,
) -> tuple[Callable[[Any, Any, Any], Any], tuple[bool, ...] | None] | None:
    """Causal attention aligned bottom-right (1 < Lq != Lk) through the aten op that torch's
    lower-right causal bias picks for inputs like q, k, v ([B, H, L, D]) under `backend`:
    FlashAttention's (whose causal is bottom-right), else the memory-efficient one with its
    lower-right mask type. The bias picks it in Python dispatch code on every call, which
    takes the host longer than a small call takes the GPU; resolved here once per geometry,
    the call is the op alone, the same kernel on the same arguments. Returns the call and the
    SDPA switches the choice depends on ("default": the global ones at resolve time, which a
    call must find unchanged; None for one backend), or None where neither op takes the inputs
    (torch then materialises the mask: left to the bias)."""
    import torch
    from torch.backends.cuda import (
        SDPAParams,
        can_use_efficient_attention,
        can_use_flash_attention,
    )
    from torch.nn.attention.bias import CausalVariant

    before = sdpa_switches()
    # What the checks read, and no length (a cache growing by a token per step asks again at
    # every step): dtypes, device, batch, heads, head dim, each stride's 8-element alignment
    # and the contiguous last dimension.
    key = (
        backend,
        before,
        q.dtype,
        q.device,
        q.shape[0],
        q.shape[1],
        q.shape[3],
        k.shape[1],
        enable_gqa,
        q.requires_grad or k.requires_grad or v.requires_grad,
        *(tuple(x % 8 == 0 or x == 1 for x in t.stride()) for t in (q, k, v)),
    )
    chosen = _RESOLVED.get(key)
    if chosen is None:
        if backend != "default":
            _set_switches(_ONLY[backend])
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a refusing backend explains itself at length
                params = SDPAParams(q, k, v, None, 0.0, False, enable_gqa)
                flash = q.shape[-1] % 8 == 0 and can_use_flash_attention(params)
                efficient = not flash and can_use_efficient_attention(params)
        finally:
            _set_switches(before)
        chosen = _RESOLVED[key] = "flash" if flash else "efficient" if efficient else "none"
    flash, efficient = chosen == "flash", chosen == "efficient"
    depends = before if backend == "default" else None
    if flash:
        flash_op = torch.ops.aten._scaled_dot_product_flash_attention.default
        real_scale = scale if scale is not None else q.shape[-1] ** -0.5

        def flash_call(q: Any, k: Any, v: Any) -> Any:
            return flash_op(q, k, v, 0.0, True, False, scale=real_scale)[0]

        return flash_call, depends
    if efficient:
        efficient_op = torch.ops.aten._efficient_attention_forward.default
        lower_right = int(CausalVariant.LOWER_RIGHT.value)

        def efficient_call(q: Any, k: Any, v: Any) -> Any:
            return efficient_op(
                q.transpose(1, 2),
                k.transpose(1, 2),
                v.transpose(1, 2),
                None,
                None,
                None,
                None,
                None,
                0.0,
                lower_right,
                False,
                scale=scale,
            )[0].transpose(1, 2)

        return efficient_call, depends
    return None


def sdpa_call(
    backend: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float | None = None,
    layout: str = "bhld",
    mask: torch.Tensor | None = None,
) -> Callable[[], torch.Tensor]:
    """A closure computing attention with one SDPA backend (output in [B, H, L, D])."""
    qb, kb, vb = (logical_bhld(t, layout) for t in (q, k, v))
    kwargs = sdpa_kwargs(
        qb.shape[2], kb.shape[2], qb.shape[1], kb.shape[1], causal=causal, scale=scale, mask=mask
    )
    call = backend_call(backend, kwargs)
    return lambda: call(qb, kb, vb)


def accepted_backends(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float | None = None,
    layout: str = "bhld",
    mask: torch.Tensor | None = None,
) -> dict[str, Callable[[], torch.Tensor]]:
    """The backends that run this problem (tried once; a backend that refuses is left out)."""
    accepted = {}
    for name in BACKENDS:
        call = sdpa_call(name, q, k, v, causal=causal, scale=scale, layout=layout, mask=mask)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a refusing backend explains itself at length
            try:
                call()
            except RuntimeError:
                continue
        accepted[name] = call
    return accepted


def _blhd(t: torch.Tensor, layout: str) -> torch.Tensor:
    """[B, L, H, D] view of a tensor in `layout` (no copy)."""
    return t if layout == "blhd" else t.transpose(1, 2)


def _lse_flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, layout: str
) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    # FlashAttention-2's forward: GQA natively, causal aligned bottom-right as ours.
    qb, kb, vb = (_blhd(t, layout) for t in (q, k, v))
    out, lse, *_ = torch.ops.aten._flash_attention_forward(
        qb, kb, vb, None, None, qb.shape[1], kb.shape[1], 0.0, causal, False, scale=scale
    )
    return out, lse


def _lse_efficient(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, layout: str
) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    qb, kb, vb = (_blhd(t, layout) for t in (q, k, v))
    group = qb.shape[2] // kb.shape[2]
    if group > 1:  # the memory-efficient kernel has no GQA: expand the key/value heads
        kb, vb = (t.repeat_interleave(group, dim=2) for t in (kb, vb))
    out, lse, *_ = torch.ops.aten._efficient_attention_forward(
        qb, kb, vb, None, None, None, None, None, 0.0, 2 if causal else 0, True, scale=scale
    )
    return out, lse[:, :, : qb.shape[1]]


def _lse_cudnn(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float, layout: str
) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    qh, kh, vh = (logical_bhld(t, layout) for t in (q, k, v))
    if kh.shape[1] != qh.shape[1] or (causal and qh.shape[2] != kh.shape[2]):
        raise RuntimeError("the cuDNN op is used for MHA, and causal only with Lq == Lk")
    out, lse, *_ = torch.ops.aten._scaled_dot_product_cudnn_attention(
        qh, kh, vh, None, True, 0.0, causal, False, scale=scale
    )
    return out.transpose(1, 2), lse.reshape(qh.shape[0], qh.shape[1], qh.shape[2])


# The torch ops that return the log-sum-exp with the output, per backend; "default" takes the
# first that runs the problem in torch's own order of preference on recent GPUs.
_LSE_OPS = {
    "flash": (_lse_flash,),
    "efficient": (_lse_efficient,),
    "cudnn": (_lse_cudnn,),
    "default": (_lse_cudnn, _lse_flash, _lse_efficient),
}
LseCall = Callable[[Any, Any, Any], tuple[Any, Any]]


def lse_call(
    backend: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    layout: str = "bhld",
) -> LseCall | None:
    """A call (q, k, v) -> (out in q's layout, fp32 LSE [B, Hq, Lq]) through a torch op of
    `backend` that computes the log-sum-exp itself, tried once on these inputs; None when no
    such op runs the problem (the caller then runs a kernel of ours instead: the LSE is never
    computed by a reference on the hot path)."""
    for op in _LSE_OPS[backend]:

        def call(q: Any, k: Any, v: Any, op: Any = op) -> tuple[Any, Any]:
            out, lse = op(q, k, v, causal, scale, layout)
            return (out if layout == "blhd" else out.transpose(1, 2)), lse.float()

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                call(q, k, v)
            except (RuntimeError, NotImplementedError):
                continue
        return call
    return None


def fallback_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float, layout: str
) -> torch.Tensor:
    """The log-sum-exp of a problem no kernel and no LSE-returning SDPA op runs (CPU tensors,
    odd dtypes): computed in fp32 by the reference."""
    from .reference import reference_attention

    return reference_attention(q, k, v, causal=causal, scale=scale, layout=layout)[1]
