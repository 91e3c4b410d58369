"""Resident CTAs per SM of a built kernel: what its registers, threads and shared memory allow.

The limits are NVIDIA's per-architecture figures (CUDA C Programming Guide, "Technical
Specifications per Compute Capability"); a kernel that loses to another at the same tile often
loses here (one resident CTA cannot hide its own softmax and load latency).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SmLimits:
    registers: int = 65536
    threads: int = 2048
    ctas: int = 32
    smem_bytes: int = 233472  # per SM, the CTA's reserved 1 KB included
    reserved_smem_per_cta: int = 1024
    register_unit: int = 256  # registers are allocated per warp in units of this many


_LIMITS = {
    80: SmLimits(smem_bytes=167936),
    86: SmLimits(threads=1536, ctas=16, smem_bytes=102400),
    87: SmLimits(smem_bytes=167936),
    89: SmLimits(threads=1536, ctas=24, smem_bytes=102400),
    90: SmLimits(),
}


def limits_for(cc: int) -> SmLimits:
    """The nearest known architecture at or below `cc` (sm_90 for anything newer)."""
    known = [k for k in sorted(_LIMITS) if k <= cc]
    return _LIMITS[known[-1] if known else 80]


def ctas_per_sm(cc: int, registers: int, threads: int, smem_bytes: int) -> dict[str, int]:
    """Resident CTAs per SM and which resource limits them: {"ctas", "by_registers", ...}."""
    lim = limits_for(cc)
    warps = -(-threads // 32)
    regs_per_warp = -(-registers * 32 // lim.register_unit) * lim.register_unit
    by_registers = lim.registers // (regs_per_warp * warps) if registers else lim.ctas
    by_smem = lim.smem_bytes // (smem_bytes + lim.reserved_smem_per_cta)
    by_threads = lim.threads // (warps * 32)
    ctas = min(by_registers, by_smem, by_threads, lim.ctas)
    return {
        "ctas": ctas,
        "by_registers": by_registers,
        "by_smem": by_smem,
        "by_threads": by_threads,
        "warps_per_sm": ctas * warps,
    }
