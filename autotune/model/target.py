"""The GPU a kernel is built for: compute capability and the limits static pruning needs."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Opt-in shared memory per block (bytes) by compute capability, from the CUDA programming guide's
# table of technical specifications. A visible GPU is asked directly instead.
_MAX_SMEM_PER_BLOCK = {
    80: 166912,
    86: 101376,
    87: 166912,
    89: 101376,
    90: 232448,
    100: 232448,
    103: 232448,
    120: 101376,
}
DEFAULT_CC = 90
# Compute capabilities a result may name: new GPUs are welcome, nonsense is not.
MIN_CC, MAX_CC = 70, 130

# Dense fp16/bf16 tensor-core FLOP per clock per SM (a multiply-add counts 2), from NVIDIA's
# published peaks divided by SM count and boost clock; with a clock above any GPU's boost, an
# upper bound of what a device can do, used to refuse impossible measurements.
_TENSOR_FLOP_PER_CLOCK_PER_SM = {
    70: 1024,
    75: 1024,
    80: 2048,
    86: 1024,
    87: 1024,
    89: 1024,
    90: 4096,
    100: 8192,
    103: 8192,
    120: 1024,
}
_CLOCK_CEILING_HZ = 2.6e9


@dataclass(frozen=True)
class Target:
    cc: int  # compute capability as major * 10 + minor: 90 for sm_90
    max_smem_per_block: int
    name: str  # the device's name, or "sm_90" for a target chosen without a device

    @property
    def arch(self) -> str:
        return f"sm_{self.cc}"


def parse_arch(text: str | int) -> int:
    """'sm_90', 'sm90', '90', '9.0' or 90 -> 90."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*(?:sm_?|compute_?)?(\d+)(?:\.(\d))?a?\s*", str(text).lower())
    if not match:
        raise ValueError(f"cannot read a compute capability from {text!r} (try sm_90)")
    major, minor = match.groups()
    return int(major) * 10 + int(minor) if minor is not None else int(major)


def target_for_arch(arch: str | int) -> Target:
    cc = parse_arch(arch)
    if cc not in _MAX_SMEM_PER_BLOCK:
        known = ", ".join(f"sm_{c}" for c in sorted(_MAX_SMEM_PER_BLOCK))
        raise ValueError(f"unknown arch sm_{cc}; known: {known}")
    return Target(cc, _MAX_SMEM_PER_BLOCK[cc], f"sm_{cc}")


def target_for_capability(cc: int) -> Target:
    """The limits of a compute capability, for judging a result that names it: a GPU this
    release does not know (within MIN_CC..MAX_CC) gets those of the newest known one older than
    it, so that the static constraints always apply."""
    if not MIN_CC <= cc <= MAX_CC:
        raise ValueError(f"compute capability {cc} is not between {MIN_CC} and {MAX_CC}")
    known = max((c for c in _MAX_SMEM_PER_BLOCK if c <= cc), default=min(_MAX_SMEM_PER_BLOCK))
    return Target(cc, _MAX_SMEM_PER_BLOCK[known], f"sm_{cc}")


def tensor_peak_flops(cc: int, sm_count: int) -> float:
    """An upper bound of the dense fp16 tensor-core FLOP/s of a GPU (see the table above); an
    unknown compute capability gets the largest rate known."""
    per_sm = _TENSOR_FLOP_PER_CLOCK_PER_SM.get(cc, max(_TENSOR_FLOP_PER_CLOCK_PER_SM.values()))
    return sm_count * per_sm * _CLOCK_CEILING_HZ


def target_for_device(index: int | None = None) -> Target:
    import torch

    device = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(device)
    cc = props.major * 10 + props.minor
    smem = getattr(props, "shared_memory_per_block_optin", 0) or _MAX_SMEM_PER_BLOCK.get(cc, 49152)
    return Target(cc, int(smem), props.name)


def default_target() -> Target:
    """The visible GPU's target, else sm_90 (compiling needs no GPU)."""
    try:
        import torch

        if torch.cuda.is_available():
            return target_for_device()
    except ImportError:
        pass
    return target_for_arch(DEFAULT_CC)
