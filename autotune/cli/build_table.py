"""The table of builds that `compile` and `demo` print: one row per config with its ptxas
report (registers, shared memory, spills, stack, wgmma serialisation), compile time and cache
hit."""

from __future__ import annotations

from ..build.compiler import BuildResult
from ..model.space import load_space
from .table import render_table

HEADER = [
    "config",
    "status",
    "regs",
    "smem KB",
    "spill st/ld",
    "stack",
    "nvcc s",
    "cached",
    "message",
]


def build_row(result: BuildResult) -> list[object]:
    name = load_space(result.config.family).name_of(result.config)
    if not result.ok:
        return [
            name,
            result.status,
            "",
            "",
            "",
            "",
            f"{result.seconds:.1f}",
            "",
            result.message.splitlines()[0][:100] if result.message else "",
        ]
    p, info = result.ptxas, result.launch_info
    assert p is not None and info is not None
    return [
        name,
        "ok",
        p.registers,
        f"{info.smem_bytes / 1024:.0f}",
        f"{p.spill_store_bytes}/{p.spill_load_bytes}",
        p.stack_frame_bytes,
        f"{result.seconds:.1f}",
        "yes" if result.cached else "",
        f"wgmma serialized ({p.wgmma_serialized})"[:100] if p.wgmma_serialized else "",
    ]


def build_table(results: list[BuildResult]) -> str:
    return render_table(HEADER, [build_row(r) for r in results])
