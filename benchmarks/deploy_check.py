"""Deployment checks on a GPU host (the `deploy` stage of benchmarks/evidence.sh):

    cd /tmp && python3 /path/to/benchmarks/deploy_check.py fresh
        after a fresh install (README command 1): `attention()` must answer llm-prefill
        problems from the results shipped in db/, with an empty tuning database and nothing
        tuned; run from outside the checkout, so the installed package is the one imported
    CUTE_AUTOTUNE_KERNELS=DIR CUTE_AUTOTUNE_CACHE=$(mktemp -d) \\
        python3 benchmarks/deploy_check.py no-toolkit
        `attention()` and `attention_with_kvcache()` from a kernel pack where neither nvcc nor
        cuda.h nor a C++ compiler can be found and the kernel cache is empty: asserts that the
        toolkit is really absent, that each call ran one of the pack's kernels (not the
        fallback), and that the outputs agree with an fp32 reference
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

PROBLEMS = [  # (dtype, B, Hq, Hkv, L, D, causal): llm-prefill problems, so "exact" is expected
    ("fp16", 1, 16, 16, 8192, 128, False),
    ("bf16", 4, 32, 8, 2048, 64, True),
    ("fp16", 16, 16, 16, 512, 64, False),
]


def fresh() -> int:
    """attention() on llm-prefill problems from the shipped results, nothing tuned."""
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
        ref = F.scaled_dot_product_attention(
            q,
            k.repeat_interleave(hq // hkv, 1),
            v.repeat_interleave(hq // hkv, 1),
            is_causal=causal,
        )
        err = float((out.float() - ref.float()).norm() / ref.float().norm())
        ok = decision.path == "exact" and err < 2e-2
        failures += not ok
        print(
            f"{'ok  ' if ok else 'FAIL'} {dtype} B={b} Hq={hq} Hkv={hkv} L={length} D={d} "
            f"causal={causal}: {decision.describe()} rel err {err:.1e}"
        )
    print(
        "fresh install answers from the shipped results"
        if not failures
        else f"{failures} problems not answered from the shipped results"
    )
    return 1 if failures else 0


def no_toolkit() -> int:
    """attention() and attention_with_kvcache() from a kernel pack, no toolkit present."""
    import torch
    import torch.nn.functional as F

    import autotune
    from autotune.build import ToolchainError, find_cuda_include, find_nvcc

    absent = {}
    for name, probe in (("nvcc", find_nvcc), ("cuda.h", find_cuda_include)):
        try:
            absent[name] = f"found at {probe()}"
        except ToolchainError:
            absent[name] = "absent"
    absent["c++ compiler"] = next(
        (f"found: {c}" for c in ("c++", "g++", "clang++") if shutil.which(c)), "absent"
    )
    failures = [f"{name} {state}" for name, state in absent.items() if state != "absent"]

    results: dict[str, Any] = {"device": torch.cuda.get_device_name(), "toolkit": absent}
    torch.manual_seed(0)
    dt = torch.bfloat16
    # A tuned llm-prefill problem (sm90 in db/h200.json), GQA 4:1, causal.
    q = torch.randn(4, 32, 2048, 128, device="cuda", dtype=dt)
    k = torch.randn(4, 8, 2048, 128, device="cuda", dtype=dt)
    v = torch.randn_like(k)
    decision = autotune.explain(q, k, v, causal=True)
    out = autotune.attention(q, k, v, causal=True)
    ref = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True
    )
    err = float(torch.linalg.vector_norm(out.float() - ref) / torch.linalg.vector_norm(ref))
    results["attention"] = {
        "decision": decision.describe(),
        "path": decision.path,
        "family": decision.config.family if decision.config else None,
        "rel_err": err,
    }
    if (
        decision.kernel is None
        or decision.config is None
        or decision.config.family == "sdpa"
        or not err < 1e-2
    ):
        failures.append(f"attention: {decision.describe()} (rel err {err:.2e})")

    # A tuned KV-cache problem (decode family): pages of 16, shuffled, GQA 4:1, Lq=4, causal.
    b, hq, hkv, lq, lk, d, page = 8, 32, 8, 4, 32768, 128, 16
    qd = torch.randn(b, lq, hq, d, device="cuda", dtype=dt)
    keys = torch.randn(b, lk, hkv, d, device="cuda", dtype=dt)
    values = torch.randn_like(keys)
    order = torch.randperm(b * lk // page, device="cuda")
    k_pages = torch.empty(b * lk // page, page, hkv, d, device="cuda", dtype=dt)
    v_pages = torch.empty_like(k_pages)
    k_pages[order] = keys.reshape(-1, page, hkv, d)
    v_pages[order] = values.reshape(-1, page, hkv, d)
    table = order.view(b, -1).to(torch.int32)
    got = autotune.attention_with_kvcache(
        qd, k_pages, v_pages, block_table=table, causal=True, layout="blhd"
    )
    mask = torch.ones(lq, lk, dtype=torch.bool, device="cuda").tril(lk - lq)
    want = F.scaled_dot_product_attention(
        qd.transpose(1, 2).float(),
        keys.transpose(1, 2).float(),
        values.transpose(1, 2).float(),
        attn_mask=mask,
        enable_gqa=True,
        scale=1 / math.sqrt(d),
    ).transpose(1, 2)
    err = float(torch.linalg.vector_norm(got.float() - want) / torch.linalg.vector_norm(want))
    results["attention_with_kvcache"] = {
        "problem": "B8 H32/8 Lq4 Lk32768 D128 bf16 causal paged16",
        "rel_err": err,
    }
    if not err < 1e-2:
        failures.append(f"attention_with_kvcache: rel err {err:.2e}")

    from autotune.launch import launcher_path

    results["launcher"] = str(launcher_path())
    results["failures"] = failures
    print(json.dumps(results, indent=1))
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=["fresh", "no-toolkit"])
    args = parser.parse_args(argv)
    return fresh() if args.check == "fresh" else no_toolkit()


if __name__ == "__main__":
    sys.exit(main())
