"""Read the LaunchInfo a kernel's traits wrote into its cubin (ELF), without a GPU.

The launcher reads the same symbol through the driver; reading it here lets the compile table
and the tests show the block size and shared memory that the kernel itself declares.
"""

from __future__ import annotations

import struct
from dataclasses import asdict, dataclass
from pathlib import Path

INFO_SYMBOL = "cute_autotune_fwd_info"
_FIELDS = (
    "abi_version",
    "family",
    "head_dim",
    "dtype",
    "causal",
    "block_m",
    "block_n",
    "threads",
    "smem_bytes",
    "persistent",
    "tma_box_cols",
    "tma_swizzle_bytes",
    "tma_box_rows_q",
    "tma_box_rows_k",
    "tma_box_rows_v",
    "tma_box_rows_o",
    "pack_gqa",
    "split_kv",
)


@dataclass(frozen=True)
class LaunchInfo:
    abi_version: int
    family: int
    head_dim: int
    dtype: int
    causal: int
    block_m: int
    block_n: int
    threads: int
    smem_bytes: int
    # The grid schedule and the TMA maps (kernel_src/common/launch_info.h); 0 = none.
    persistent: int = 0
    tma_box_cols: int = 0
    tma_swizzle_bytes: int = 0
    tma_box_rows_q: int = 0
    tma_box_rows_k: int = 0
    tma_box_rows_v: int = 0
    tma_box_rows_o: int = 0
    # GQA heads packed into a tile's rows; split-KV with a combine entry (the decode family)
    pack_gqa: int = 0
    split_kv: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class CubinError(ValueError):
    pass


def read_launch_info(cubin: bytes | Path, symbol: str = INFO_SYMBOL) -> LaunchInfo:
    """The LaunchInfo stored under `symbol` (a forward cubin's by default; a backward cubin
    stores the same struct under its own name)."""
    data = cubin.read_bytes() if isinstance(cubin, Path) else cubin
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise CubinError("not a 64-bit little-endian ELF cubin")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    for sec in sections:
        if sec[1] != 2:  # SHT_SYMTAB
            continue
        strtab = sections[sec[6]]
        for j in range(sec[5] // 24):
            st_name, _info, _other, st_shndx, st_value, st_size = struct.unpack_from(
                "<IBBHQQ", data, sec[4] + j * 24
            )
            end = data.index(b"\0", strtab[4] + st_name)
            if data[strtab[4] + st_name : end].decode() != symbol:
                continue
            if st_size != 4 * len(_FIELDS):
                raise CubinError(f"{symbol} has {st_size} bytes, expected {4 * len(_FIELDS)}")
            target = sections[st_shndx]
            values = struct.unpack_from(f"<{len(_FIELDS)}i", data, target[4] + st_value)
            return LaunchInfo(*values)
    raise CubinError(f"no {symbol} symbol in the cubin")
