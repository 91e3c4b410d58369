"""Validate a backward pass (dQ, dK, dV) against the fp32 reference on the forward validator's
problems (measure.validate.DEFAULT_CASES: tails, Lq != Lk both ways, GQA and MQA, both layouts,
a packed-QKV view, adversarial score patterns).

For every case: fresh seeded inputs and upstream gradient, the gradients written into outputs
poisoned with NaN and surrounded by NaN padding, two runs on the same inputs; then, per
gradient, the relative and the max-abs error against the reference. NaN never passes; a write
outside a gradient fails; the dQ rows of queries that see no key must be exactly 0. A backward
accumulates dQ across key blocks (atomics, in an order that may change from run to run), so two
runs may differ in their last bits: the report says whether they were identical, and
`deterministic=True` makes a difference a failure (the deterministic mode's contract).

The bound of each gradient is relative to the error the dtype itself brings to the case: the
reference computed again with what a kernel holds in the input dtype rounded to it (O, P, dS;
reference_backward's `rounded_to`) lands some distance from the fp32 reference, and a kernel's
gradient may land at most ERR_FACTOR times as far (max-abs and norm of the difference), plus a
floor for gradients that are 0 but for rounding. A relative error alone cannot judge a case like
a single key or uniform scores, whose dQ is exactly 0 in exact arithmetic.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ..launch.tensors import logical_bhld
from ..model.problem import Problem
from .reference import reference_attention
from .reference_backward import reference_gradients
from .validate import DEFAULT_CASES, PAD_ROWS, Case, make_inputs

if TYPE_CHECKING:
    import torch

    # run(q, k, v, dout, dq=, dk=, dv=, scale=, layout=): the forward and backward under test,
    # writing the gradients into dq, dk, dv (q's, k's and v's layouts)
    BackwardRunner = Callable[..., Any]

GRADIENTS = ("dq", "dk", "dv")
ERR_FACTOR = 8.0  # a gradient's error: at most this many times the dtype's own, ...
ERR_FLOOR = 1e-5  # ... plus this much of max(1, max |reference|)


@dataclass(frozen=True)
class GradientCaseResult:
    case: str
    problem: str
    passed: bool
    reason: str = ""
    rel_err: dict[str, float] = field(default_factory=dict)  # per gradient
    max_abs_err: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)  # the max-abs error allowed
    identical_runs: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GradientReport:
    passed: bool
    seed: int
    deterministic: bool
    cases: tuple[GradientCaseResult, ...] = ()

    @property
    def failures(self) -> list[GradientCaseResult]:
        return [c for c in self.cases if not c.passed]

    def worst_share(self) -> float:
        """The largest max-abs error of any gradient of any case, as a share of its bound."""
        shares = [
            c.max_abs_err[g] / c.bound[g]
            for c in self.cases
            for g in c.max_abs_err
            if c.bound.get(g, 0) > 0
        ]
        return max(shares) if shares else math.nan

    def summary(self) -> str:
        if not self.passed:
            return "; ".join(f"{c.case}: {c.reason}" for c in self.failures)
        same = sum(bool(c.identical_runs) for c in self.cases)
        return (
            f"{len(self.cases)} cases passed (the largest error at {self.worst_share():.2f} of "
            f"its bound; {same} of {len(self.cases)} bit-identical across two runs)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "seed": self.seed,
            "deterministic": self.deterministic,
            "cases": [c.as_dict() for c in self.cases],
        }


def _poisoned(like: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(gradient, storage): NaN everywhere, a view with NaN rows after each head's rows."""
    import torch

    b, first, second, d = like.shape  # [B, H, L, D] or [B, L, H, D]
    if layout == "bhld":
        storage = torch.full(
            (b, first, second + PAD_ROWS, d), math.nan, dtype=like.dtype, device=like.device
        )
        return storage[:, :, :second], storage
    storage = torch.full(
        (b, first + PAD_ROWS, second, d), math.nan, dtype=like.dtype, device=like.device
    )
    return storage[:, :first], storage


def _padding_intact(storage: torch.Tensor, length: int, layout: str) -> bool:
    import torch

    pad = storage[:, :, length:] if layout == "bhld" else storage[:, length:]
    return bool(torch.isnan(pad).all())


def check_gradient_case(
    run: BackwardRunner,
    case: Case,
    problem: Problem,
    generator: torch.Generator,
    device: torch.device,
    deterministic: bool = False,
) -> GradientCaseResult:
    import torch

    q, k, v = make_inputs(case, problem, generator, device)
    dout = torch.randn(q.shape, generator=generator, device=device).to(q.dtype)
    scale = case.scale if case.scale is not None else 1.0 / math.sqrt(problem.head_dim)
    lengths = {"dq": problem.seqlen_q, "dk": problem.seqlen_k, "dv": problem.seqlen_k}

    def fail(reason: str, **stats: Any) -> GradientCaseResult:
        return GradientCaseResult(case.name, problem.describe(), False, reason, **stats)

    runs = []
    for _ in range(2):
        made = {g: _poisoned(t, case.layout) for g, t in zip(GRADIENTS, (q, k, v), strict=True)}
        try:
            run(
                q,
                k,
                v,
                dout,
                **{g: made[g][0] for g in GRADIENTS},
                scale=scale,
                layout=case.layout,
            )
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as exc:  # a launch error is this case's result
            return fail(f"launch failed: {type(exc).__name__}: {exc}")
        runs.append(made)
    for g in GRADIENTS:
        grad, storage = runs[0][g]
        if bool(torch.isnan(grad).any()):
            return fail(
                f"{int(torch.isnan(grad).sum())} {g} elements are NaN (unwritten, or "
                "computed as NaN)"
            )
        if not _padding_intact(storage, lengths[g], case.layout):
            return fail(f"a write landed outside {g}")
    identical = all(torch.equal(runs[0][g][0], runs[1][g][0]) for g in GRADIENTS)
    if deterministic and not identical:
        return fail(
            "two runs on the same inputs differ (the deterministic mode must not)",
            identical_runs=False,
        )

    refs = reference_gradients(
        q, k, v, dout, causal=problem.causal, scale=scale, layout=case.layout
    )
    _, ref_lse = reference_attention(
        q, k, v, causal=problem.causal, scale=scale, layout=case.layout
    )
    rounded = reference_gradients(
        q, k, v, dout, causal=problem.causal, scale=scale, layout=case.layout, rounded_to=q.dtype
    )
    rel, max_abs, bound = {}, {}, {}
    for g, ref, own in zip(GRADIENTS, refs, rounded, strict=True):
        got = logical_bhld(runs[0][g][0], case.layout).float()
        magnitude = max(1.0, float(ref.abs().max()))
        norm = float(torch.linalg.vector_norm(ref))
        rel[g] = float(torch.linalg.vector_norm(got - ref)) / max(norm, 1e-30)
        max_abs[g] = float((got - ref).abs().max())
        bound[g] = ERR_FACTOR * float((own - ref).abs().max()) + ERR_FLOOR * magnitude
        norm_err = float(torch.linalg.vector_norm(got - ref))
        norm_bound = ERR_FACTOR * float(torch.linalg.vector_norm(own - ref)) + (
            ERR_FLOOR * magnitude * math.sqrt(ref.numel())
        )
        if not math.isfinite(norm_err) or norm_err > norm_bound:
            bound[g] = -norm_bound  # marks the norm as the bound exceeded
    stats: dict[str, Any] = {
        "rel_err": rel,
        "max_abs_err": max_abs,
        "bound": {g: abs(b) for g, b in bound.items()},
        "identical_runs": identical,
    }
    empty_rows = torch.isneginf(ref_lse)  # queries that see no key: dQ exactly 0
    dq = logical_bhld(runs[0]["dq"][0], case.layout)
    if bool(empty_rows.any()) and bool((dq[empty_rows] != 0).any()):
        return fail("the dq rows of queries that see no key must be exactly 0", **stats)
    for g in GRADIENTS:
        if bound[g] < 0:
            return fail(
                f"{g}: the norm of its error is above {ERR_FACTOR:g}x the dtype's own "
                f"(+ floor) {-bound[g]:.3e}",
                **stats,
            )
        if not math.isfinite(max_abs[g]) or max_abs[g] > bound[g]:
            return fail(
                f"{g}: max abs error {max_abs[g]:.3e} above {ERR_FACTOR:g}x the dtype's "
                f"own (+ floor) {bound[g]:.3e}",
                **stats,
            )
    return GradientCaseResult(case.name, problem.describe(), True, "", **stats)


def validate_backward(
    run: BackwardRunner,
    *,
    head_dim: int,
    dtype: str,
    causal: bool,
    device: Any = None,
    cases: Sequence[Case] = DEFAULT_CASES,
    seed: int | None = None,
    deterministic: bool = False,
) -> GradientReport:
    """Run every case through `run` and compare its gradients with the reference."""
    import torch

    device = torch.device(device if device is not None else "cuda")
    seed = int.from_bytes(os.urandom(6), "little") if seed is None else seed
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    results = tuple(
        check_gradient_case(
            run, case, case.problem(head_dim, dtype, causal), generator, device, deterministic
        )
        for case in cases
    )
    return GradientReport(all(r.passed for r in results), seed, deterministic, results)


def kernel_runner(kernel: Any) -> BackwardRunner:
    """The validator's runner of a backward kernel (launch.backward.CompiledBackward): the
    fp32 reference forward (its output in the input dtype, its LSE), then the kernel's
    backward into the validator's (poisoned) gradient tensors."""
    import torch

    def run(
        q: Any, k: Any, v: Any, dout: Any, *, dq: Any, dk: Any, dv: Any, scale: float, layout: str
    ) -> None:
        out32, lse = reference_attention(q, k, v, causal=kernel.causal, scale=scale, layout=layout)
        out = torch.empty_like(q)
        logical_bhld(out, layout).copy_(out32)
        kernel(
            q, k, v, out, dout, lse.contiguous(), scale=scale, layout=layout, dq=dq, dk=dk, dv=dv
        )

    return run
