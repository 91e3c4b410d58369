"""On the GPU: a misaligned view never reaches a torch SDPA backend (on torch 2.11 with cuDNN
9.19 the default backend returned a wrong result for one and broke the CUDA context), the
argument checks are the same on the kernel path, and attention() is safe from many threads at
once (the memo, cubin loading and compile on a miss)."""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from autotune.launch.tensors import InputError
from autotune.measure.reference import reference_attention
from autotune.runtime import attention as runtime
from autotune.runtime.attention import attention, configure

pytestmark = pytest.mark.gpu


def rel_err(
    out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    layout: str = "bhld",
) -> float:
    ref, _ = reference_attention(
        q, k, v, causal=causal, scale=1 / math.sqrt(q.shape[-1]), layout=layout
    )
    assert bool(torch.isfinite(out).all())
    return float((out.float() - ref).norm() / ref.norm())


@pytest.fixture
def private_db(tmp_path: Path) -> Iterator[str]:
    url = f"sqlite:///{tmp_path}/dispatch.db"
    configure(db=url, use_shipped=False)
    yield url
    configure()


@pytest.mark.parametrize("offset", [1, 3, 7])
def test_a_misaligned_view_is_copied_before_sdpa_sees_it(offset: int, private_db: str) -> None:
    base = torch.randn(2, 8, 512, 136, device="cuda", dtype=torch.float16)
    q = base[..., offset : offset + 128]  # pointer 2*offset bytes off 16-byte alignment
    k = torch.randn(2, 8, 512, 128, device="cuda", dtype=torch.float16)
    v = torch.randn_like(k)
    assert q.data_ptr() % 16
    runtime._warned.clear()  # the warning comes once per reason and process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = attention(q, k, v)
    assert rel_err(out, q, k, v) < 2e-3
    assert any("not 16-byte aligned" in str(w.message) for w in caught)
    # the CUDA context still works afterwards
    torch.cuda.synchronize()
    assert float(torch.ones(1000, device="cuda").sum()) == 1000.0
    assert q.data_ptr() == base.data_ptr() + 2 * offset  # the caller's tensors are untouched


def cuda_qkv() -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(1, 4, 256, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))


@pytest.mark.parametrize(
    "scale", ["0.1", True, torch.tensor(0.125)], ids=["str", "bool", "tensor"]
)
def test_the_kernel_path_refuses_what_the_fallback_refuses(scale: object, private_db: str) -> None:
    with pytest.raises(InputError, match="scale"):
        attention(*cuda_qkv(), scale=scale)  # type: ignore[arg-type]


@pytest.mark.parametrize("scale", [math.nan, math.inf, 0.0, -1.0])
def test_the_kernel_path_refuses_invalid_scales(scale: float, private_db: str) -> None:
    with pytest.raises(InputError, match="scale"):
        attention(*cuda_qkv(), scale=scale)


SHAPES = [  # (B, Hq, Hkv, L, D, dtype, causal): two problem classes, four geometries
    (2, 8, 8, 256, 64, torch.float16, False),
    (1, 8, 2, 300, 64, torch.float16, False),
    (2, 4, 4, 200, 128, torch.bfloat16, True),
    (1, 8, 4, 512, 128, torch.bfloat16, True),
]


def test_many_threads_at_once(
    private_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # an empty cubin cache: the first calls compile on a miss, from several threads at once
    monkeypatch.setenv("CUTE_AUTOTUNE_CACHE", str(tmp_path / "cache"))
    runtime._prepared.clear()
    threads, rounds = 8, 6
    start = threading.Barrier(threads)
    errors: list[str] = []

    def work(index: int) -> None:
        try:
            start.wait()
            for r in range(rounds):
                b, hq, hkv, length, d, dtype, causal = SHAPES[(index + r) % len(SHAPES)]
                q = torch.randn(b, hq, length, d, device="cuda", dtype=dtype)
                k = torch.randn(b, hkv, length, d, device="cuda", dtype=dtype)
                v = torch.randn_like(k)
                out = attention(q, k, v, causal=causal)
                err = rel_err(out, q, k, v, causal=causal)
                if not err < 1e-2:
                    errors.append(
                        f"thread {index} round {r} shape {SHAPES[(index + r) % 4]}: "
                        f"rel err {err:.2e}"
                    )
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none lost
            errors.append(f"thread {index}: {type(exc).__name__}: {exc}")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    assert errors == []
    # a fallback to SDPA would hide the kernels' part
    assert not [str(w.message) for w in caught if "falling back" in str(w.message)]
    paths = {
        runtime.explain(
            *(
                torch.empty(s[0], h, s[3], s[4], device="cuda", dtype=s[5])
                for h in (s[1], s[2], s[2])
            ),
            causal=s[6],
        ).path
        for s in SHAPES
    }
    assert paths == {"heuristic"}
