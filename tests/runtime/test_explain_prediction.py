"""explain() shows what the performance model shipped for the GPU predicts of the decision's
config and of torch SDPA's default (issue 38, item 1), without changing the decision; nothing
where no model ships for the GPU or the model never learnt the family; a note where the
family's kernels changed since the fit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import autotune.runtime.dispatch as dispatch_module
from autotune.model import Config, Problem, target_for_arch
from autotune.runtime.dispatch import Dispatcher, with_prediction
from autotune.store.records import DeviceInfo

H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
H100 = DeviceInfo("NVIDIA H100 80GB HBM3", 90, 132, "580.159.04", "13.0")
PREFILL = Problem(3, 12, 12, 1531, 1531, 64, "fp16", True)


@pytest.fixture
def decision(tmp_path: Path) -> dispatch_module.Decision:
    found = Dispatcher(f"sqlite:///{tmp_path}/d.db").would_run(PREFILL, H200, target_for_arch(90))
    assert found.config is not None and found.config.family in ("sm90", "sdpa")
    return found


def test_the_prediction_is_shown_beside_the_decision(decision: dispatch_module.Decision) -> None:
    shown = with_prediction(decision, PREFILL, H200)
    assert shown.predicted is not None and shown.predicted.startswith(
        "the NVIDIA H200 model (shipped in db/) predicts"
    )
    assert shown.predicted in shown.describe() and " us (p20-p80 " in shown.predicted
    assert replace(shown, predicted=None) == decision  # the decision itself is unchanged


def test_nothing_is_predicted_without_a_model_or_a_known_family(
    decision: dispatch_module.Decision,
) -> None:
    assert with_prediction(decision, PREFILL, H100) == decision
    decode90 = Config.make(
        "decode90",
        {
            "head_dim": 128,
            "dtype": "bf16",
            "causal": True,
            "block_m": 64,
            "block_n": 128,
            "consumer_wgs": 1,
            "kv_stages": 2,
            "overlap": False,
            "ctas_per_sm": 1,
            "num_splits": 1,
        },
    )
    unknown = replace(decision, config=decode90)
    assert with_prediction(unknown, PREFILL, H200) == unknown


def test_a_family_changed_since_the_fit_is_said(
    decision: dispatch_module.Decision, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatch_module, "family_source_hash", lambda space: "changed")
    shown = with_prediction(decision, PREFILL, H200)
    assert shown.predicted is not None and "older version" in shown.predicted
