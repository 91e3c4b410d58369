"""`tune --model CONFIG` (issue 38, item 5): the problems a Hugging Face model runs, from its
config.json, a folder or a model id in the local Hugging Face cache (nothing downloaded), at the
batch sizes and lengths a user serves; what the kernels do not serve yet is named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune.cli.main import main
from autotune.model.hf_model import find_config, model_attention
from autotune.model.problem import Problem
from autotune.store.queue import WorkQueue
from autotune.store.repo import TuningStore

LLAMA3 = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "torch_dtype": "bfloat16",
}
QWEN25 = {
    "model_type": "qwen2",
    "hidden_size": 3584,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "sliding_window": 131072,
    "use_sliding_window": False,
    "torch_dtype": "bfloat16",
}
MISTRAL = {
    "model_type": "mistral",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "sliding_window": 4096,
    "torch_dtype": "bfloat16",
}
GEMMA2 = {
    "model_type": "gemma2",
    "hidden_size": 3584,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "sliding_window": 4096,
    "attn_logit_softcapping": 50.0,
    "torch_dtype": "bfloat16",
}
PHI3 = {
    "model_type": "phi3",
    "hidden_size": 3072,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "torch_dtype": "bfloat16",
}
PHI2 = {
    "model_type": "phi",
    "hidden_size": 2560,
    "num_attention_heads": 32,
    "torch_dtype": "float16",
}
GPT_OSS = {
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "sliding_window": 128,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("config", "shape", "notes"),
    [
        (LLAMA3, (32, 8, 128, "bf16"), []),
        (QWEN25, (28, 4, 128, "bf16"), []),
        (PHI3, (32, 32, 96, "bf16"), []),
        (MISTRAL, (32, 8, 128, "bf16"), ["sliding window of 4096"]),
        (GEMMA2, (16, 8, 256, "bf16"), ["sliding window of 4096", "soft-capped scores"]),
        (GPT_OSS, (64, 8, 64, "bf16"), ["sliding window of 128", "attention sinks"]),
        ({**LLAMA3, "torch_dtype": "float16"}, (32, 8, 128, "fp16"), []),
        ({**LLAMA3, "torch_dtype": "float32"}, (32, 8, 128, "bf16"), ["tuned in bf16"]),
        ({"model_type": "llava", "text_config": LLAMA3}, (32, 8, 128, "bf16"), []),
    ],
    ids=[
        "llama3",
        "qwen2.5",
        "phi3",
        "mistral",
        "gemma2",
        "gpt-oss",
        "fp16",
        "fp32",
        "text_config",
    ],
)
def test_a_models_attention(
    config: dict[str, Any], shape: tuple[Any, ...], notes: list[str]
) -> None:
    model = model_attention(config).shape
    assert (model.heads_q, model.heads_kv, model.head_dim, model.dtype) == shape
    said = model_attention(config).notes
    assert len(said) == len(notes)
    for note, expected in zip(said, notes, strict=True):
        assert expected in note


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({}, "num_attention_heads"),
        ({**LLAMA3, "num_key_value_heads": 5}, "not a multiple of num_key_value_heads"),
        ({**LLAMA3, "num_attention_heads": "32"}, "num_attention_heads"),
        ({**LLAMA3, "hidden_size": 4097}, r"hidden_size \(4097\) is not a multiple"),
        ({**LLAMA3, "head_dim": -1}, "head_dim"),
        ([], "a JSON object"),
    ],
)
def test_a_broken_config_names_its_field(config: Any, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        model_attention(config)


def test_problems_prefill_and_decode_at_each_batch() -> None:
    problems = model_attention(LLAMA3).problems([1, 8], [2048, 8192], [1, 4])
    assert len(problems) == 2 * (2 + 2 * 2)
    assert Problem(1, 32, 8, 2048, 2048, 128, "bf16", True) in problems
    assert Problem(8, 32, 8, 1, 8192, 128, "bf16", False) in problems
    assert Problem(8, 32, 8, 4, 2048, 128, "bf16", True) in problems


def test_a_model_id_is_found_in_the_local_hugging_face_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    repo = tmp_path / "models--meta-llama--Llama-3.1-8B"
    for snapshot in ("old", "abc123"):
        (repo / "snapshots" / snapshot).mkdir(parents=True)
        (repo / "snapshots" / snapshot / "config.json").write_text(json.dumps(LLAMA3))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123\n")
    assert find_config("meta-llama/Llama-3.1-8B") == repo / "snapshots/abc123/config.json"
    with pytest.raises(FileNotFoundError, match="nothing is downloaded"):
        find_config("nobody/nothing")


def _config(tmp_path: Path, config: dict[str, Any]) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_tune_model_enqueues_what_the_model_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path}/q.db"
    status = main(
        [
            "tune",
            "--model",
            _config(tmp_path, MISTRAL),
            "--batches",
            "1",
            "4",
            "--lengths",
            "4096",
            "--decode-tokens",
            "1",
            "8",
            "--enqueue",
            "--for-gpu",
            "NVIDIA H200:90:132",
            "--db",
            db,
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    assert "32 query heads, 8 key/value heads, head dim 128, bf16" in out
    assert "note: a sliding window of 4096" in out
    assert "6 problems" in out
    items = WorkQueue(TuningStore(db)).items()
    assert {item.problem for item in items} == set(
        model_attention(MISTRAL).problems([1, 4], [4096], [1, 8])
    )


def test_tune_model_of_a_head_dim_no_kernel_has_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        [
            "tune",
            "--model",
            _config(tmp_path, PHI2),
            "--enqueue",
            "--for-gpu",
            "NVIDIA H200:90:132",
            "--db",
            f"sqlite:///{tmp_path}/q.db",
        ]
    )
    captured = capsys.readouterr()
    assert status == 1
    assert "head dim 80 is not one the kernels have" in captured.err


@pytest.mark.parametrize("extra", [["--shapes", "llm-prefill"], ["--heads-q", "8"]])
def test_tune_model_takes_no_other_shape(
    tmp_path: Path, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", "--model", _config(tmp_path, LLAMA3), *extra]) == 2
    assert "tune --model takes the model's shapes" in capsys.readouterr().err


def test_a_model_that_is_not_there_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(
            [
                "tune",
                "--model",
                str(tmp_path / "none.json"),
                "--enqueue",
                "--for-gpu",
                "NVIDIA H200:90:132",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no model config" in err
