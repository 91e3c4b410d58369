"""The main job without a GPU: the static analysis names every family the target runs and
builds each family's default (the build itself is stubbed here; test_compile_nvcc.py runs nvcc)."""

from __future__ import annotations

from typing import Any

import pytest

from autotune.cli import demo
from autotune.model.config import Config
from autotune.model.target import target_for_arch


@pytest.mark.parametrize("cc, families", [(90, ["sm80", "sm90"]), (80, ["sm80"])])
def test_without_a_gpu_the_demo_analyses_and_builds_each_family(
    cc: int,
    families: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    built: list[Config] = []

    class Ok:
        ok = True

    def fake_compile(configs: list[Config], target: Any) -> list[Ok]:
        built.extend(configs)
        return [Ok() for _ in configs]

    monkeypatch.setattr(demo, "default_target", lambda: target_for_arch(cc))
    monkeypatch.setattr(demo, "compile_many", fake_compile)
    monkeypatch.setattr(demo, "build_table", lambda results: "builds")
    rc = demo.run(128, False, 4, None, gpu=False)
    out = capsys.readouterr().out
    assert rc == 0 and "No CUDA GPU is visible here" in out
    assert [c.family for c in built] == families
    assert all(c["head_dim"] == 128 and not c["causal"] for c in built)
    for family in families:
        assert f"\n{family} " in out
    if cc == 80:
        assert "sm90" not in out


def test_a_failed_build_fails_the_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    class Failed:
        ok = False

    monkeypatch.setattr(demo, "default_target", lambda: target_for_arch(90))
    monkeypatch.setattr(demo, "compile_many", lambda configs, target: [Failed() for _ in configs])
    monkeypatch.setattr(demo, "build_table", lambda results: "builds")
    assert demo.run(64, True, 4, None, gpu=False) == 1
