"""A Hugging Face decoder with transformers' SDPA and with `attn_implementation="cute_autotune"`:
time per forward pass (prefill of the prompt, then one decode step against its cache), the
output difference, and which attention kernels ran (a torch profiler trace of each phase: the
project's kernels are `cute_autotune_fwd` / `cute_autotune_combine`). The model is built from a
config with random weights (nothing downloaded). The two implementations alternate call by call
(ours, SDPA, ours, ...), CUDA events around each, the median per implementation.

    python benchmarks/model_bench.py [--layers 4 --hidden 4096 --heads 32 --kv-heads 8
                                      --batch 2 --seqlen 2048] [--json FILE]

Exit status 1 when the prefill pass ran none of the project's kernels (the tuned path did not
run, only the fallback), or the two implementations disagree beyond bf16 rounding.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

OURS_KERNELS = ("cute_autotune_fwd", "cute_autotune_combine")
TORCH_ATTENTION = ("flash", "fmha", "cudnn", "attention", "efficient")


def kernels_of(step: Callable[[], Any]) -> dict[str, int]:
    """Names and launch counts of the GPU kernels one call of `step` runs."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        step()
        torch.cuda.synchronize()
    counts: dict[str, int] = {}
    for event in trace.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:  # type: ignore[attr-defined]
            counts[event.name] = counts.get(event.name, 0) + 1
    return counts


def attention_kernels(counts: dict[str, int]) -> dict[str, int]:
    ours = sum(n for name, n in counts.items() if any(k in name for k in OURS_KERNELS))
    torchs = sum(n for name, n in counts.items()
                 if not any(k in name for k in OURS_KERNELS)
                 and any(k in name.lower() for k in TORCH_ATTENTION))
    return {"ours": ours, "torch_sdpa": torchs}


def alternate(calls: dict[str, Callable[[], Any]], reps: int) -> dict[str, float]:
    """Median milliseconds per callable, the callables alternating call by call."""
    import torch

    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(reps):
        for name, call in calls.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(100_000)  # the host issues the call before its start event fires
            start.record()
            call()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end))
    return {name: statistics.median(t) for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--host-profile", type=int, default=0, metavar="N",
                        help="print the N functions of most cumulative host time over 20 of "
                             "our decode steps (cProfile)")
    args = parser.parse_args(argv)

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import autotune

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=args.hidden,
                         intermediate_size=args.hidden * 11 // 4,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads,
                         max_position_embeddings=args.seqlen + 16)
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()  # type: ignore[arg-type]
    ours_name = autotune.register_transformers()
    prompt = torch.randint(0, config.vocab_size, (args.batch, args.seqlen), device="cuda")

    def prefill(impl: str) -> Callable[[], Any]:
        def call() -> Any:
            model.set_attn_implementation(impl)
            return model(prompt, use_cache=False).logits
        return call

    with torch.inference_mode():
        model.set_attn_implementation("sdpa")
        cached = model(prompt, use_cache=True)
        cache, next_token = cached["cache"], cached.logits[:, -1:].argmax(-1)

        def decode(impl: str) -> Callable[[], Any]:
            def call() -> Any:
                model.set_attn_implementation(impl)
                logits = model(next_token, cache=cache, use_cache=True).logits
                cache.crop(-1)  # the next call decodes the same step again
                return logits
            return call

        results: dict[str, Any] = {"model": {
            "layers": args.layers, "hidden": args.hidden, "heads": args.heads,
            "kv_heads": args.kv_heads, "head_dim": args.hidden // args.heads,
            "batch": args.batch, "seqlen": args.seqlen, "dtype": "bf16"},
            "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "command": "benchmarks/model_bench.py " + " ".join(argv or sys.argv[1:])}
        failures = []
        for phase, make in (("prefill", prefill), ("decode_step", decode)):
            ours, sdpa = make(ours_name), make("sdpa")
            for _ in range(3):  # compile, load and dispatch before anything is timed
                ours(), sdpa()
            got, want = ours().float(), sdpa().float()
            rel = float(torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want))
            top1 = float((got.argmax(-1) == want.argmax(-1)).float().mean())
            ms = alternate({"ours": ours, "sdpa": sdpa}, args.reps)
            ran = attention_kernels(kernels_of(ours))
            ran_sdpa = attention_kernels(kernels_of(sdpa))
            results[phase] = {"ours_ms": ms["ours"], "sdpa_ms": ms["sdpa"],
                              "speedup": ms["sdpa"] / ms["ours"], "logits_rel_diff": rel,
                              "top1_agreement": top1, "attention_kernels_ours_run": ran,
                              "attention_kernels_sdpa_run": ran_sdpa}
            if not (rel < 2e-2 and torch.isfinite(got).all()):
                failures.append(f"{phase}: logits differ from SDPA's by {rel:.3g}")
        if results["prefill"]["attention_kernels_ours_run"]["ours"] < args.layers:
            failures.append("prefill: the project's kernels did not run in every layer")
        results["failures"] = failures
        if args.host_profile:
            import cProfile
            import pstats

            step = decode(ours_name)
            with cProfile.Profile() as profiler:
                for _ in range(20):
                    step()
                torch.cuda.synchronize()
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(args.host_profile)

    print(f"{torch.cuda.get_device_name()}: Llama {args.layers} layers, hidden {args.hidden}, "
          f"heads {args.heads}/{args.kv_heads}, B={args.batch}, prompt {args.seqlen}, bf16")
    print(f"{'phase':12s} {'ours ms':>9s} {'SDPA ms':>9s} {'speed-up':>9s} {'rel diff':>9s} "
          f"{'top-1':>6s}  attention kernels (ours / torch's) in our pass")
    for phase in ("prefill", "decode_step"):
        r = results[phase]
        k = r["attention_kernels_ours_run"]
        print(f"{phase:12s} {r['ours_ms']:9.3f} {r['sdpa_ms']:9.3f} {r['speedup']:8.3f}x "
              f"{r['logits_rel_diff']:9.2e} {r['top1_agreement']:6.3f}  {k['ours']} / "
              f"{k['torch_sdpa']}")
    for failure in failures:
        print("FAILED:", failure)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
