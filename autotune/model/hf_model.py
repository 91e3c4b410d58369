"""The attention problems a Hugging Face model runs, read from its `config.json`.

`tune --model` takes a config file, a folder holding one, or a model id already in the local
Hugging Face cache (nothing is downloaded), and the batch sizes and lengths a user serves. The
attention of every layer is the same problem here (Hq, Hkv, head dim, dtype); what the kernels
do not compute yet (a sliding window, soft-capped scores, attention sinks) is named in `notes`,
so a user knows which layers the tuned problems stand for. transformers is not imported: the
config is plain JSON.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .._jsonfile import read_json
from .._shown import shown
from .problem import Problem

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "bf16": "bf16", "fp16": "fp16"}


@dataclass(frozen=True)
class ModelAttention:
    """One model's attention, and what of it is not served: `shape` is its problem at batch 1
    and length 1 (its heads, head dim and dtype), which `problems` sizes."""

    name: str
    shape: Problem
    layers: int | None
    notes: tuple[str, ...]

    def problems(
        self, batches: list[int], lengths: list[int], decode_tokens: list[int]
    ) -> list[Problem]:
        """Prefill (causal, Lq = Lk = each length) and decode steps (Lq = each of
        `decode_tokens` against a cache of each length; causal where Lq > 1, the shape sets'
        convention) at each batch size, in that order, without repeats."""
        found: dict[Problem, None] = {}
        for batch in batches:
            for length in lengths:
                found.setdefault(
                    replace(self.shape, batch=batch, seqlen_q=length, seqlen_k=length, causal=True)
                )
            for tokens in decode_tokens:
                for length in lengths:
                    found.setdefault(
                        replace(
                            self.shape,
                            batch=batch,
                            seqlen_q=tokens,
                            seqlen_k=length,
                            causal=tokens > 1,
                        )
                    )
        return list(found)


def _hub_cache() -> Path:
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache", "huggingface"
    )
    return Path(home).expanduser() / "hub"


def find_config(source: str) -> Path:
    """The config.json of `source`: a file, a folder holding one, or a model id ("org/name")
    in the local Hugging Face cache (the snapshot `refs/main` names, else the newest).
    FileNotFoundError says where it looked."""
    path = Path(source).expanduser()
    if path.is_file():
        return path
    if path.is_dir() and (path / "config.json").is_file():
        return path / "config.json"
    repo = _hub_cache() / f"models--{source.replace('/', '--')}"
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file():
        named = snapshots / ref.read_text().strip() / "config.json"
        if named.is_file():
            return named
    found = sorted(snapshots.glob("*/config.json"), key=lambda p: p.stat().st_mtime)
    if found:
        return found[-1]
    raise FileNotFoundError(
        f"no model config for {source!r}: not a config.json, a folder holding one, or a model "
        f"id in the local Hugging Face cache ({_hub_cache()}; nothing is downloaded: "
        f"`huggingface-cli download {source} config.json` fetches it)"
    )


def _integer(config: dict[str, Any], name: str, default: int | None = None) -> int:
    value = config.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(
            f"the model config's {name} must be a positive integer, got {shown(value)}"
        )
    return value


def model_attention(config: Any, name: str = "model") -> ModelAttention:
    """The attention of a model from its config (a multimodal model's `text_config`).
    ValueError names a field that is missing or wrong."""
    if not isinstance(config, dict):
        raise ValueError(f"a model config is a JSON object, got {type(config).__name__}")
    text = config.get("text_config")
    if isinstance(text, dict):
        config = {**config, **text}
    heads_q = _integer(config, "num_attention_heads")
    heads_kv = _integer(config, "num_key_value_heads", heads_q)
    if heads_q % heads_kv:
        raise ValueError(
            f"num_attention_heads ({heads_q}) is not a multiple of "
            f"num_key_value_heads ({heads_kv})"
        )
    if config.get("head_dim") is not None:
        head_dim = _integer(config, "head_dim")
    else:
        hidden = _integer(config, "hidden_size")
        if hidden % heads_q:
            raise ValueError(
                f"hidden_size ({hidden}) is not a multiple of num_attention_heads "
                f"({heads_q}) and the config names no head_dim"
            )
        head_dim = hidden // heads_q
    notes = []
    declared = config.get("torch_dtype", config.get("dtype"))
    dtype = _DTYPES.get(declared) if isinstance(declared, str) else None
    if dtype is None:
        dtype = "bf16"
        notes.append(
            f"weights in {shown(declared)}: tuned in bf16, as such models are served "
            "(--dtype chooses)"
        )
    window = config.get("sliding_window")
    if (
        isinstance(window, int)
        and not isinstance(window, bool)
        and window > 0
        and config.get("use_sliding_window", True) is not False
    ):
        notes.append(
            f"a sliding window of {window} (its layers are not served by the kernels "
            "yet: tuned here as full causal attention)"
        )
    for field, what in (
        ("attn_logit_softcapping", "soft-capped scores"),
        ("logit_softcapping", "soft-capped scores"),
    ):
        if config.get(field):
            notes.append(
                f"{what} ({field} = {shown(config[field])}): not served by the kernels yet"
            )
            break
    if (
        config.get("model_type") == "gpt_oss"
        or config.get("sinks")
        or config.get("attention_sinks")
    ):
        notes.append("attention sinks: not served by the kernels yet")
    layers = config.get("num_hidden_layers")
    shape = Problem(1, heads_q, heads_kv, 1, 1, head_dim, dtype)
    return ModelAttention(name, shape, layers if isinstance(layers, int) else None, tuple(notes))


def read_model(source: str) -> ModelAttention:
    """`model_attention` of the config `find_config` finds for `source`."""
    path = find_config(source)
    return model_attention(read_json(path), name=source)
