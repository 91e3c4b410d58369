"""Validate a kernel against the fp32 reference on problems built to break it.

For every case: fresh random inputs (seeded per run, the seed is reported), outputs poisoned with
NaN and surrounded by NaN padding, two launches whose results must be bit-identical (the forward
pass has no atomics, so a difference is a race), then relative and max-abs error of O and the
error of LSE against dtype thresholds. NaN never passes. Rows that see no key must be exactly 0
with LSE = -inf.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..launch.tensors import logical_bhld, torch_dtype
from ..model.problem import Problem
from .reference import reference_attention

if TYPE_CHECKING:
    import torch

    # run(q, k, v, out=, lse=, scale=, layout=): the kernel under test, writing into out / lse.
    Runner = Callable[..., Any]

# ||out - ref|| / ||ref|| and max |out - ref| / max(1, max |ref|). Measured on the H200 over
# every case (benchmarks/results/smoke): fp16 rel <= 2.8e-4, bf16 rel <= 2.3e-3; the bounds
# leave ~3.5x of headroom, while a masking or rescaling bug costs 1e-2 and more.
REL_TOL = {"fp16": 1e-3, "bf16": 8e-3}
ABS_TOL = {"fp16": 4e-3, "bf16": 3e-2}
LSE_ATOL = 2e-3
LSE_RTOL = 1e-4
PAD_ROWS = 37  # NaN rows after each output head: a write past Lq shows up there


@dataclass(frozen=True)
class Case:
    """A problem built to break a kernel, and how its inputs are made.

    `shape` gives the sizes (batch, heads, lengths); the head dim, dtype and causality are the
    kernel's under test, which `problem` puts in."""

    name: str
    shape: Problem
    layout: str = "bhld"
    inputs: str = "normal"  # normal | uniform | concentrated | large | packed
    want_lse: bool = True
    scale: float | None = None  # None: 1/sqrt(D)

    def problem(self, head_dim: int, dtype: str, causal: bool) -> Problem:
        return replace(self.shape, head_dim=head_dim, dtype=dtype, causal=causal)


def _sizes(batch: int, heads_q: int, heads_kv: int, seqlen_q: int, seqlen_k: int) -> Problem:
    # the head dim (and dtype, causality) here stand in for the kernel's: Case.problem sets them
    return Problem(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim=64)


# Sequence lengths that are not tile multiples (1, 17, 127, 1000, ...), Lq != Lk both ways,
# GQA 4:1 and MQA, both layouts, a packed-QKV strided view, and adversarial score patterns.
DEFAULT_CASES: tuple[Case, ...] = (
    Case("aligned", _sizes(2, 4, 4, 256, 256)),
    Case("tails_lq127_lk1000", _sizes(1, 3, 3, 127, 1000)),
    Case("single_query_single_key", _sizes(2, 2, 2, 1, 1)),
    Case("decode_lq1_lk17_no_lse", _sizes(1, 4, 4, 1, 17), want_lse=False),
    Case("gqa4_blhd", _sizes(2, 8, 2, 200, 200), layout="blhd"),
    Case("mqa_lq333_lk517", _sizes(1, 6, 1, 333, 517)),
    Case("lq300_gt_lk77", _sizes(1, 2, 2, 300, 77)),
    Case("packed_qkv_view", _sizes(2, 4, 4, 190, 190), layout="blhd", inputs="packed"),
    Case("uniform_scores", _sizes(1, 2, 2, 257, 257), inputs="uniform"),
    Case("concentrated_softmax", _sizes(1, 2, 2, 384, 384), inputs="concentrated", scale=0.3),
    Case("large_magnitudes", _sizes(1, 2, 2, 190, 1025), inputs="large"),
    Case("multi_tile_gqa2", _sizes(1, 4, 2, 1000, 1000)),
    # More work tiles than an H200 has SMs (432 at block_m 128), Lq > Lk: a persistent kernel
    # walks several tiles per CTA, of different lengths, some rows seeing no key when causal.
    Case("many_tiles_per_sm_gqa4", _sizes(2, 24, 6, 1100, 900)),
)


@dataclass(frozen=True)
class CaseResult:
    case: str
    problem: str
    passed: bool
    reason: str = ""
    rel_err: float = math.nan
    max_abs_err: float = math.nan
    lse_max_err: float = math.nan

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ValidationReport:
    passed: bool
    seed: int
    cases: tuple[CaseResult, ...] = field(default_factory=tuple)

    @property
    def failures(self) -> list[CaseResult]:
        return [c for c in self.cases if not c.passed]

    @property
    def worst_rel_err(self) -> float:
        errs = [c.rel_err for c in self.cases if not math.isnan(c.rel_err)]
        return max(errs) if errs else math.nan

    def summary(self) -> str:
        if self.passed:
            return f"{len(self.cases)} cases passed (worst rel err {self.worst_rel_err:.2e})"
        return "; ".join(f"{c.case}: {c.reason}" for c in self.failures)

    def as_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "seed": self.seed,
            "cases": [c.as_dict() for c in self.cases],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ValidationReport:
        """The report `as_dict` wrote (a `cute-autotune check --json` result's "report")."""
        return cls(
            bool(data["passed"]),
            int(data["seed"]),
            tuple(CaseResult(**case) for case in data["cases"]),
        )


def make_inputs(
    case: Case, problem: Problem, generator: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v in the case's layout and pattern."""
    import torch

    dtype = torch_dtype(problem.dtype)
    b, hq, hkv, lq, lk, d = (
        problem.batch,
        problem.heads_q,
        problem.heads_kv,
        problem.seqlen_q,
        problem.seqlen_k,
        problem.head_dim,
    )

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device, dtype=torch.float32)

    def shaped(heads: int, length: int) -> tuple[int, ...]:
        return (b, heads, length, d) if case.layout == "bhld" else (b, length, heads, d)

    if case.inputs == "packed":
        if hq != hkv or lq != lk or case.layout != "blhd":
            raise ValueError("packed inputs need MHA, Lq == Lk and the blhd layout")
        qkv = randn(b, lq, 3, hq, d).to(dtype)  # one buffer, as a fused QKV projection gives
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    q, k, v = randn(*shaped(hq, lq)), randn(*shaped(hkv, lk)), randn(*shaped(hkv, lk))
    if case.inputs == "uniform":
        # every key identical: each row's scores are all equal, softmax is exactly uniform
        row = k[:, :1] if case.layout == "blhd" else k[:, :, :1]
        k = row.expand_as(k).contiguous()
    elif case.inputs == "concentrated":
        q, k = q * 6.0, k * 6.0  # scores with a spread of ~36 sigma: one key takes ~all weight
    elif case.inputs == "large":
        q, k, v = q * 3.0, k * 3.0, v * 200.0
    elif case.inputs != "normal":
        raise ValueError(f"unknown input pattern {case.inputs!r}")
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _poisoned_outputs(
    q: torch.Tensor, problem: Problem, layout: str, want_lse: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(out, out_storage, lse, lse_storage): NaN everywhere, views with NaN padding around."""
    import torch

    b, h, lq, d = problem.batch, problem.heads_q, problem.seqlen_q, problem.head_dim
    if layout == "bhld":
        storage = torch.full((b, h, lq + PAD_ROWS, d), math.nan, dtype=q.dtype, device=q.device)
        out = storage[:, :, :lq]
    else:
        storage = torch.full((b, lq + PAD_ROWS, h, d), math.nan, dtype=q.dtype, device=q.device)
        out = storage[:, :lq]
    if not want_lse:
        return out, storage, None, None
    lse_storage = torch.full(
        (b * h * lq + PAD_ROWS,), math.nan, dtype=torch.float32, device=q.device
    )
    return out, storage, lse_storage[: b * h * lq].view(b, h, lq), lse_storage


def _padding_intact(storage: torch.Tensor, layout: str, lq: int) -> bool:
    import torch

    pad = storage[:, :, lq:] if layout == "bhld" else storage[:, lq:]
    return bool(torch.isnan(pad).all())


def check_case(
    run: Runner, case: Case, problem: Problem, generator: torch.Generator, device: torch.device
) -> CaseResult:
    import torch

    q, k, v = make_inputs(case, problem, generator, device)
    scale = case.scale if case.scale is not None else 1.0 / math.sqrt(problem.head_dim)

    def fail(reason: str, **stats: float) -> CaseResult:
        return CaseResult(case.name, problem.describe(), False, reason, **stats)

    results = []
    for _ in range(2):
        out, storage, lse, lse_storage = _poisoned_outputs(q, problem, case.layout, case.want_lse)
        try:
            run(q, k, v, out=out, lse=lse, scale=scale, layout=case.layout)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as exc:  # a launch error is this case's result
            return fail(f"launch failed: {type(exc).__name__}: {exc}")
        results.append((out, storage, lse, lse_storage))
    out, storage, lse, lse_storage = results[0]

    if torch.isnan(out).any():
        n = int(torch.isnan(out).sum())
        return fail(f"{n} output elements are NaN (unwritten, or computed as NaN)")
    if not _padding_intact(storage, case.layout, problem.seqlen_q):
        return fail("a write landed outside the output (rows beyond Lq)")
    if lse is not None and lse_storage is not None:
        if torch.isnan(lse).any():
            return fail(f"{int(torch.isnan(lse).sum())} LSE entries are NaN (unwritten)")
        if not torch.isnan(lse_storage[lse.numel() :]).all():
            return fail("a write landed past the end of LSE")
    out2, _, lse2, _ = results[1]
    same = torch.equal(out.view(torch.int16), out2.view(torch.int16))
    if lse is not None and lse2 is not None:
        same = same and torch.equal(lse.view(torch.int32), lse2.view(torch.int32))
    if not same:
        return fail("two launches on the same inputs differ (a race)")

    ref_out, ref_lse = reference_attention(
        q, k, v, causal=problem.causal, scale=scale, layout=case.layout
    )
    got = logical_bhld(out, case.layout).float()
    return judge(case.name, problem.describe(), got, ref_out, lse, ref_lse, problem.dtype)


def judge(
    name: str,
    described: str,
    got: torch.Tensor,
    ref_out: torch.Tensor,
    lse: torch.Tensor | None,
    ref_lse: torch.Tensor,
    dtype: str,
) -> CaseResult:
    """An output (fp32, [B, H, Lq, D]) and its LSE against the fp32 reference: rows that see
    no key exactly 0 with LSE -inf, the LSE within its bound, the relative and the max absolute
    error within the dtype's tolerance. Every case of the validator ends here."""
    import torch

    def fail(reason: str, **stats: float) -> CaseResult:
        return CaseResult(name, described, False, reason, **stats)

    empty_rows = torch.isneginf(ref_lse)  # rows that see no key (causal, Lq > Lk; length 0)
    if bool(empty_rows.any()) and bool((got[empty_rows] != 0).any()):
        return fail("rows that see no key must be exactly 0")
    diff = got - ref_out
    ref_norm = float(torch.linalg.vector_norm(ref_out))
    rel = (
        float(torch.linalg.vector_norm(diff)) / ref_norm
        if ref_norm > 0
        else float(torch.linalg.vector_norm(diff))
    )
    max_abs = float(diff.abs().max())
    scale_abs = max(1.0, float(ref_out.abs().max()))
    lse_err = 0.0
    if lse is not None:
        if not torch.equal(torch.isneginf(lse), empty_rows):
            return fail(
                "LSE must be -inf exactly for rows that see no key",
                rel_err=rel,
                max_abs_err=max_abs,
            )
        finite = ~empty_rows
        if bool(finite.any()):
            err = (lse[finite] - ref_lse[finite]).abs()
            lse_err = float(err.max())
            bound = LSE_ATOL + LSE_RTOL * ref_lse[finite].abs()
            if bool((err > bound).any()):
                return fail(
                    f"LSE error {lse_err:.3e} above {LSE_ATOL:.0e} + {LSE_RTOL:.0e}*|lse|",
                    rel_err=rel,
                    max_abs_err=max_abs,
                    lse_max_err=lse_err,
                )
    stats = {"rel_err": rel, "max_abs_err": max_abs, "lse_max_err": lse_err}
    if not math.isfinite(rel) or rel > REL_TOL[dtype]:
        return fail(f"relative error {rel:.3e} above {REL_TOL[dtype]:.1e}", **stats)
    if max_abs > ABS_TOL[dtype] * scale_abs:
        return fail(
            f"max abs error {max_abs:.3e} above {ABS_TOL[dtype]:.1e} * {scale_abs:.3g}", **stats
        )
    return CaseResult(name, described, True, "", **stats)


def validate(
    run: Runner,
    *,
    head_dim: int,
    dtype: str,
    causal: bool,
    device: Any = None,
    cases: Sequence[Case] = DEFAULT_CASES,
    seed: int | None = None,
) -> ValidationReport:
    """Run every case through `run` and compare with the reference."""
    import torch

    device = torch.device(device if device is not None else "cuda")
    seed = int.from_bytes(os.urandom(6), "little") if seed is None else seed
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    results = tuple(
        check_case(run, case, case.problem(head_dim, dtype, causal), generator, device)
        for case in cases
    )
    return ValidationReport(all(r.passed for r in results), seed, results)
