"""After a fresh install (README command 1) on a GPU host: `attention()` must answer llm-prefill
problems from the results shipped in db/, with an empty tuning database and nothing tuned.
Run from outside the checkout so the installed package is the one imported.

    cd /tmp && python3 /path/to/benchmarks/fresh_dispatch.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

PROBLEMS = [  # (dtype, B, Hq, Hkv, L, D, causal): llm-prefill problems, so "exact" is expected
    ("fp16", 1, 16, 16, 8192, 128, False),
    ("bf16", 4, 32, 8, 2048, 64, True),
    ("fp16", 16, 16, 16, 512, 64, False),
]


def main() -> int:
    os.environ["CUTE_AUTOTUNE_DB"] = f"sqlite:///{tempfile.mkdtemp()}/empty.db"
    import torch
    import torch.nn.functional as F

    import autotune

    where = Path(autotune.__file__).resolve()
    print(f"autotune imported from {where}")
    if Path(__file__).resolve().parent.parent in where.parents:
        print("FAIL: imported the checkout, not the installed package")
        return 1
    failures = 0
    for dtype, b, hq, hkv, length, d, causal in PROBLEMS:
        torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
        q = torch.randn(b, hq, length, d, device="cuda", dtype=torch_dtype)
        k = torch.randn(b, hkv, length, d, device="cuda", dtype=torch_dtype)
        v = torch.randn_like(k)
        decision = autotune.explain(q, k, v, causal=causal)
        out = autotune.attention(q, k, v, causal=causal, strict=True)
        ref = F.scaled_dot_product_attention(q, k.repeat_interleave(hq // hkv, 1),
                                             v.repeat_interleave(hq // hkv, 1), is_causal=causal)
        err = float((out.float() - ref.float()).norm() / ref.float().norm())
        ok = decision.path == "exact" and err < 2e-2
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {dtype} B={b} Hq={hq} Hkv={hkv} L={length} D={d} "
              f"causal={causal}: {decision.describe()} rel err {err:.1e}")
    print("fresh install answers from the shipped results" if not failures
          else f"{failures} problems not answered from the shipped results")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
