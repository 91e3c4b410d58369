"""End to end in a transformers model: `attn_implementation="cute_autotune"` against "sdpa" (and
"flash_attention_2" / "flex_attention" where the host has them), in one alternation per row.

One pinned model shape (issue 39): a Llama decoder with hidden 4096, intermediate 14336, 32/8
heads (D=128), vocab 128256, 8 layers, random weights, bf16 (nothing downloaded). Rows:

- prefill: one forward of a B1 prompt at each `--prefill` length (no cache);
- verify: a speculative verify step, `--verify` draft tokens against a cache of each
  `--cache` length (the cache is cropped back after each call, so every call is the same step);
- decode: one decode step at each `--batches` batch size against a `--decode-cache` cache;
- generate: greedy `generate` of `--new-tokens` tokens from a `--prompt` prompt, tokens/s.

`--modes eager,compiled`: compiled rows run `torch.compile(model)` (fixed shapes per row);
a row that fails to compile records its error and the run goes on. Each call is timed with CUDA
events after a ~50 us GPU spin (the host issues the call before its start event fires), the
implementations alternating call by call (L2 flushed before each), the median per
implementation, and the call-by-call ratio's p20-p80 beside each speed-up; logits are compared
with "sdpa"'s (relative norm) and the project's kernels counted in one profiled call. A JSON
document and, with `--plot`, a chart of the speed-ups.

    python benchmarks/e2e_model.py --json OUT.json [--plot OUT.png] [--modes eager,compiled]
    python benchmarks/e2e_model.py --tiny --device cpu --json OUT.json   # a smoke run anywhere
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

PINNED = {
    "hidden": 4096,
    "intermediate": 14336,
    "heads": 32,
    "kv_heads": 8,
    "vocab": 128256,
    "layers": 8,
}
TINY = {"hidden": 128, "intermediate": 256, "heads": 4, "kv_heads": 2, "vocab": 97, "layers": 2}
OURS_KERNELS = ("cute_autotune_fwd", "cute_autotune_combine")
OTHERS = ("flash_attention_2", "flex_attention")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


class Timer:
    """Milliseconds of one call: CUDA events after an L2 flush and a GPU spin, or the wall
    clock on a CPU."""

    def __init__(self, device: str) -> None:
        import torch

        self.cuda = device == "cuda"
        self.flush = (
            torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda") if self.cuda else None
        )

    def __call__(self, call: Callable[[], Any], before: Callable[[], Any] | None = None) -> float:
        """`before` runs untimed (switching the model's attention implementation walks its
        modules on the host, which a host-bound step would otherwise count)."""
        import torch

        if before is not None:
            before()
        if not self.cuda:
            start = time.perf_counter()
            call()
            return (time.perf_counter() - start) * 1e3
        assert self.flush is not None
        self.flush.zero_()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(100_000)
        begin.record()
        call()
        end.record()
        torch.cuda.synchronize()
        return float(begin.elapsed_time(end))


def alternate(
    calls: dict[str, Callable[[], Any]],
    timer: Timer,
    reps: int,
    before: Mapping[str, Callable[[], Any]] | None = None,
) -> dict[str, Any]:
    """Median ms per implementation, alternating call by call (`before[name]` run untimed
    ahead of each), and the p20/p50/p80 of sdpa's time over ours per round."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(reps):
        for name, call in calls.items():
            times[name].append(timer(call, (before or {}).get(name)))
    medians = {name: statistics.median(t) for name, t in times.items()}
    ratios = sorted(s / o for s, o in zip(times["sdpa"], times["ours"], strict=True))

    def pick(q: float) -> float:
        return ratios[min(len(ratios) - 1, int(q * len(ratios)))]

    return {
        "median_ms": medians,
        "speedup": medians["sdpa"] / medians["ours"],
        "speedup_p20": pick(0.2),
        "speedup_p80": pick(0.8),
    }


def kernels_run(call: Callable[[], Any], device: str) -> dict[str, int] | None:
    """How many of the project's attention kernels one call launches (CUDA only)."""
    if device != "cuda":
        return None
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        call()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA  # type: ignore[attr-defined]
    ours = len(
        [
            e
            for e in trace.events()
            if e.device_type == cuda and any(k in e.name for k in OURS_KERNELS)
        ]
    )
    return {"ours": ours}


def build_model(shape: dict[str, int], device: str, max_length: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        max_position_embeddings=max_length,
    )
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    with torch.device(device):  # initialised where it runs: billions of weights on a CPU are slow
        model: Any = LlamaForCausalLM(config)
    return model.to(dtype).eval()


def available(names: list[str]) -> list[str]:
    """Of `names`, the attention implementations transformers can run here."""
    found = []
    for name in names:
        try:
            if name == "flash_attention_2":
                import flash_attn  # noqa: F401
            elif name == "flex_attention":
                from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
            found.append(name)
        except ImportError:
            continue
    return found


def rows_of(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for mode in args.modes:
        rows += [{"phase": "prefill", "mode": mode, "batch": 1, "length": n} for n in args.prefill]
        rows += [
            {"phase": "verify", "mode": mode, "batch": 1, "draft": d, "cache": c}
            for c in args.cache
            for d in args.verify
        ]
        rows += [
            {"phase": "decode", "mode": mode, "batch": b, "cache": args.decode_cache}
            for b in args.batches
        ]
        if mode == "eager":  # generate() compiles its own static-cache path; eager only here
            rows.append(
                {
                    "phase": "generate",
                    "mode": mode,
                    "batch": 1,
                    "prompt": args.prompt,
                    "new_tokens": args.new_tokens,
                }
            )
    return rows


def run_row(
    model: Any, row: dict[str, Any], impls: list[str], timer: Timer, args: argparse.Namespace
) -> dict[str, Any]:
    """One row: each implementation's callable, their alternation and the logits check."""
    import torch
    import transformers

    device, vocab = args.device, model.config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(1)

    def ids(batch: int, length: int) -> torch.Tensor:
        return torch.randint(0, vocab, (batch, length), generator=gen).to(device)

    if row["mode"] == "compiled":
        # one graph per row's shapes and per implementation (the name is read in the graph)
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 256)
        torch._dynamo.config.accumulated_cache_size_limit = max(
            torch._dynamo.config.accumulated_cache_size_limit, 4096
        )
        forward = torch.compile(model, dynamic=False)
    else:
        forward = model
    phase = row["phase"]
    if phase == "prefill":
        prompt = ids(1, row["length"])

        def make(impl: str) -> Callable[[], Any]:
            return lambda: forward(prompt, use_cache=False).logits[:, -1]
    elif phase in ("verify", "decode"):
        batch = row["batch"]
        length = row["cache"]
        steps = row.get("draft", 1)
        context, step = ids(batch, length), ids(batch, steps)
        model.set_attn_implementation("sdpa")
        cache = transformers.DynamicCache(config=model.config)
        model(context, past_key_values=cache, use_cache=True)

        def make(impl: str) -> Callable[[], Any]:
            def call() -> Any:
                logits = forward(step, past_key_values=cache, use_cache=True).logits
                cache.crop(-steps)  # the next call is the same step again
                return logits

            return call
    else:
        prompt = ids(row["batch"], row["prompt"])
        settings = {
            "max_new_tokens": row["new_tokens"],
            "min_new_tokens": row["new_tokens"],
            "do_sample": False,
            "pad_token_id": 0,
        }

        def make(impl: str) -> Callable[[], Any]:
            return lambda: model.generate(prompt, **settings)

    calls, switch = {}, {}
    for impl in impls:
        name = "ours" if impl == args.ours else impl
        switch[name] = lambda impl=impl: model.set_attn_implementation(impl)
        calls[name] = make(impl)

    def switched(name: str) -> Callable[[], Any]:
        def call() -> Any:
            switch[name]()
            return calls[name]()

        return call

    with torch.inference_mode():
        for name in calls:  # compile, load and decide before anything is timed
            switched(name)()
            switched(name)()
        outs = {name: switched(name)() for name in calls}
        result = alternate(calls, timer, args.reps, before=switch)
        if phase == "generate":
            tokens = row["batch"] * row["new_tokens"]
            result["tokens_per_s"] = {
                name: tokens / (ms / 1e3) for name, ms in result["median_ms"].items()
            }
            result["tokens_equal"] = bool(torch.equal(outs["ours"], outs["sdpa"]))
        else:
            got, want = outs["ours"].float(), outs["sdpa"].float()
            result["logits_rel_diff"] = float(
                torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want)
            )
        switch["ours"]()
        result["kernels"] = kernels_run(calls["ours"], device)
    return {**row, **result}


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if "speedup" in r]
    labels = [label(r) for r in done]
    values = [r["speedup"] for r in done]
    errors = [
        [r["speedup"] - r["speedup_p20"] for r in done],
        [r["speedup_p80"] - r["speedup"] for r in done],
    ]
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(done)), 4))
    ax.bar(range(len(done)), values, yerr=errors, capsize=2)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(done)), labels, rotation=70, ha="right", fontsize=7)
    ax.set_ylabel('speed-up over "sdpa" (p20-p80)')
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def label(row: dict[str, Any]) -> str:
    what = {
        "prefill": f"prefill L{row.get('length')}",
        "verify": f"verify {row.get('draft')} vs {row.get('cache')}",
        "decode": f"decode B{row.get('batch')} vs {row.get('cache')}",
        "generate": f"generate {row.get('new_tokens')}",
    }[row["phase"]]
    return f"{what} ({row['mode']})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", required=True, help="the rows (written after each row)")
    parser.add_argument("--plot", help="a chart of the speed-ups (needs matplotlib)")
    parser.add_argument(
        "--modes",
        type=lambda t: t.split(","),
        default=["eager"],
        help="eager, compiled or both (default eager)",
    )
    parser.add_argument("--prefill", type=_ints, default=[2048, 8192, 32768])
    parser.add_argument("--verify", type=_ints, default=[4, 8, 16])
    parser.add_argument("--cache", type=_ints, default=[4096, 16384, 32768])
    parser.add_argument("--batches", type=_ints, default=[1, 8, 64])
    parser.add_argument("--decode-cache", type=int, default=4096)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="a 2-layer, hidden-128 model (a smoke run, not a measurement)",
    )
    parser.add_argument(
        "--stop-after", type=float, default=None, help="start no new row after this many seconds"
    )
    args = parser.parse_args(argv)

    import torch

    import autotune

    shape = TINY if args.tiny else PINNED
    args.ours = autotune.register_transformers()
    longest = max(
        [
            *args.prefill,
            *(c + 16 for c in args.cache),
            args.decode_cache + 1,
            args.prompt + args.new_tokens,
        ]
    )
    model = build_model(shape, args.device, longest + 16)
    impls = [args.ours, "sdpa", *available(list(OTHERS))]
    timer = Timer(args.device)
    doc: dict[str, Any] = {
        "command": "benchmarks/e2e_model.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": {
            **shape,
            "head_dim": shape["hidden"] // shape["heads"],
            "dtype": "bf16" if args.device == "cuda" else "fp32",
        },
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "implementations": impls,
        "rows": [],
    }
    started = time.monotonic()
    for row in rows_of(args):
        if args.stop_after is not None and time.monotonic() - started > args.stop_after:
            print(f"stopped after {args.stop_after} s", flush=True)
            break
        try:
            done = run_row(model, row, impls, timer, args)
        except Exception as exc:  # noqa: BLE001 - a row that fails is recorded, the rest run
            done = {**row, "error": f"{type(exc).__name__}: {exc}"[:500]}
        doc["rows"].append(done)
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        if "error" in done:
            print(f"{label(row):<34} error: {done['error'][:120]}", flush=True)
        else:
            ms = done["median_ms"]
            print(
                f"{label(row):<34} ours {ms['ours']:9.3f} ms  sdpa {ms['sdpa']:9.3f} ms  "
                f"{done['speedup']:.3f}x ({done['speedup_p20']:.3f}-{done['speedup_p80']:.3f})"
                f"  kernels {done['kernels']}",
                flush=True,
            )
    if args.plot:
        try:
            plot(doc["rows"], args.plot)
        except ImportError:
            print("--plot needs matplotlib: no chart written")
    return 0 if doc["rows"] and not any("error" in r for r in doc["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
