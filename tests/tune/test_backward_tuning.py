"""A backward problem's tuning session on the CPU: which families it searches (the backward
ones; a shape set mixing passes gives each problem the families of its pass), what its
studies are named (never a forward problem's), and the config values its search holds fixed
(the mode, too). The trial itself is measure.trial.evaluate_backward, run on the GPU
(tests/gpu/test_tuning_gpu.py)."""

from __future__ import annotations

import pytest

from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.model.target import Target, target_for_arch
from autotune.store.records import DeviceInfo
from autotune.tune.search import families_to_search, study_name

H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
SHAPE = (2, 32, 8, 4096, 4096, 128, "bf16", True)
FORWARD = Problem(*SHAPE)
BACKWARD = Problem(*SHAPE, backward=True)
DETERMINISTIC = Problem(*SHAPE, backward=True, deterministic=True)


class Stub:
    """What families_to_search asks of a backend."""

    def __init__(self, arch: str) -> None:
        self._target = target_for_arch(arch)

    def target(self) -> Target:
        return self._target

    def families(self) -> list[str]:
        from autotune.model.space import supported_families

        return supported_families(self._target)


def test_a_backward_problem_searches_the_backward_families() -> None:
    backend = Stub("sm_90")
    assert families_to_search(backend, None, BACKWARD) == ["bwd"]  # type: ignore[arg-type]
    assert "bwd" not in families_to_search(backend, None, FORWARD)  # type: ignore[arg-type]
    # asked for both passes' families (a mixed shape set): each problem gets its own
    asked = ["sm90", "bwd"]
    assert families_to_search(backend, asked, BACKWARD) == ["bwd"]  # type: ignore[arg-type]
    assert families_to_search(backend, asked, FORWARD) == ["sm90"]  # type: ignore[arg-type]


def test_a_pass_without_a_family_asked_for_is_refused_by_name() -> None:
    backend = Stub("sm_90")
    with pytest.raises(ValueError, match="no backward family among sm90 runs B2 H32/8"):
        families_to_search(backend, ["sm90"], BACKWARD)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only backward families were asked for"):
        families_to_search(backend, ["bwd"], FORWARD)  # type: ignore[arg-type]


def test_each_pass_has_its_own_studies() -> None:
    names = {study_name(H200, "sdpa", p) for p in (FORWARD, BACKWARD, DETERMINISTIC)}
    assert len(names) == 3
    assert study_name(H200, "sdpa", FORWARD).endswith("-lq4096-lk4096")  # as it always was


def test_the_search_holds_the_mode_fixed() -> None:
    space = load_space("bwd")
    target = target_for_arch("sm_90")
    for problem in (BACKWARD, DETERMINISTIC):
        fixed = space.problem_values(problem)
        configs = space.valid_configs(target, fixed)
        assert configs
        assert {bool(c["deterministic"]) for c in configs} == {problem.deterministic}
