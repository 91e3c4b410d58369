"""Parse ptxas' resource report (`nvcc -Xptxas -v`) into a value."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class PtxasReport:
    function: str
    arch: str
    registers: int
    stack_frame_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    static_smem_bytes: int
    barriers: int
    # Why ptxas serialised the function's wgmmas ("C7515: ..."), or "" when it did not. A
    # serialised Hopper kernel is correct but waits for every wgmma before the next: a
    # fraction of its speed, with nothing else in the report to show it.
    wgmma_serialized: str = ""

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0

    def as_dict(self) -> dict[str, int | str]:
        return asdict(self)


class PtxasParseError(ValueError):
    pass


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")
_SERIALIZED = re.compile(
    r"\((C\d+)\) Potential Performance Loss: wgmma\.mma_async instructions are serialized"
    r" due to (.*?) in the function '([^']+)'"
)


def parse_ptxas(text: str, function: str | None = None) -> PtxasReport:
    """The report of `function` (default: the only entry function) in nvcc's stderr."""
    reports: list[PtxasReport] = []
    serialized: dict[str, str] = {}
    for code, reason, name in _SERIALIZED.findall(text):
        serialized.setdefault(name, f"{code}: {' '.join(reason.split())}")
    lines = text.splitlines()
    for i, line in enumerate(lines):
        entry = _ENTRY.search(line)
        if not entry:
            continue
        name, arch = entry.groups()
        frame = used = None
        for follow in lines[i + 1 : i + 6]:
            if _ENTRY.search(follow):
                break
            frame = frame or _FRAME.search(follow)
            if "Used" in follow and _USED.search(follow):
                used = follow
        if frame is None or used is None:
            raise PtxasParseError(f"incomplete ptxas report for {name}")
        barriers = _BARRIERS.search(used)
        smem = _SMEM.search(used)
        reports.append(
            PtxasReport(
                function=name,
                arch=arch,
                registers=int(_USED.search(used).group(1)),  # type: ignore[union-attr]
                stack_frame_bytes=int(frame.group(1)),
                spill_store_bytes=int(frame.group(2)),
                spill_load_bytes=int(frame.group(3)),
                static_smem_bytes=int(smem.group(1)) if smem else 0,
                barriers=int(barriers.group(1)) if barriers else 0,
                wgmma_serialized=serialized.get(name, ""),
            )
        )
    if function is not None:
        reports = [r for r in reports if r.function == function]
    if len(reports) != 1:
        found = ", ".join(r.function for r in reports) or "none"
        raise PtxasParseError(f"expected one ptxas entry report, found {found}")
    return reports[0]
