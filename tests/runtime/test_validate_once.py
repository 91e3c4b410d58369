"""A config is validated once, where it enters, and travels as a ValidConfig: build key,
compile, codegen and naming take it as it is, and the first attention() call of a tuned
problem checks each config it reads once.

Counted on the first call of a tuned problem whose kernel is not compiled yet (CPU: the GPU's
identity, nvcc and the kernel load are stubbed; store, space, dispatch, compile_config, the
cache and codegen are real), before the ValidConfig:

    domain checks (Space.validate)       9: the stored row (read by best() and nearest()),
                                             the heuristic, one in each of the three
                                             violations() (dispatch, lookup, compile_config),
                                             three in render (render, name_of, traits_of)
    target checks (Space.violations)     3: dispatch, lookup, compile_config

and after: 3 domain checks, all where a config enters (the stored row twice, the heuristic
table once), and 2 target checks (dispatch's, compile_config's).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace, TracebackType
from typing import Any

import pytest
import torch

from autotune.build import compiler
from autotune.build.codegen import render
from autotune.build.compiler import build_key, compile_config, compile_many, lookup
from autotune.build.cubin import LaunchInfo
from autotune.build.ptxas import PtxasReport
from autotune.build.toolchain import Toolchain
from autotune.launch.tensors import read_problem
from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.space import Space, ValidConfig, load_space
from autotune.model.status import Status
from autotune.model.target import target_for_arch
from autotune.runtime import attention as attention_module
from autotune.runtime import dispatch as dispatch_module
from autotune.runtime.dispatch import Dispatcher
from autotune.store.records import DeviceInfo, TrialResult
from autotune.store.repo import TuningStore

H200 = target_for_arch(90)
H200_DEVICE = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
P = Problem(4, 16, 16, 2048, 2048, 128, "fp16", False)
# Where a config enters: a stored row read back, the space's own heuristic table.
ENTRIES = ("autotune.store.", "autotune.model.space.heuristic")
CHECKING = {"validate", "violations", "validate_config", "_domain_reasons", "counted"}


class Checks:
    """Counts the space's domain checks (by the function that asked, outside the checking
    functions themselves) and target checks while installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.domain: Counter[str] = Counter()
        self.target = 0
        domain, violations = Space._domain_reasons, Space.violations

        def counted_domain(space: Space, config: Config) -> list[str]:
            self.domain[_asker()] += 1
            return domain(space, config)

        def counted_violations(space: Space, config: Config, target: Any) -> list[str]:
            self.target += 1
            return violations(space, config, target)

        monkeypatch.setattr(Space, "_domain_reasons", counted_domain)
        monkeypatch.setattr(Space, "violations", counted_violations)

    def reset(self) -> None:
        self.domain.clear()
        self.target = 0

    def __enter__(self) -> Checks:
        self.reset()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        pass


def _asker() -> str:
    frame = sys._getframe(1)
    while frame.f_code.co_name in CHECKING or frame.f_code.co_name.startswith("counted"):
        assert frame.f_back is not None
        frame = frame.f_back
    return f"{frame.f_globals['__name__']}.{frame.f_code.co_name}"


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> Checks:
    return Checks(monkeypatch)


@pytest.fixture
def fake_nvcc(monkeypatch: pytest.MonkeyPatch, cache_root: Path) -> list[list[str]]:
    """compile_config without the CUDA toolkit: a fixed toolchain, an nvcc that writes a stub
    cubin, and the ptxas report and launch info of that cubin. Returns nvcc's command lines."""
    tools = Toolchain(Path("/fake/bin/nvcc"), "13.0.88", Path("/fake/cutlass"), "4.2.0")
    runs: list[list[str]] = []

    def run(command: list[str], **kwargs: object) -> SimpleNamespace:
        runs.append(command)
        Path(command[command.index("-o") + 1]).write_bytes(b"stub cubin")
        return SimpleNamespace(returncode=0, stderr="")

    monkeypatch.setattr(compiler, "toolchain", lambda: tools)
    monkeypatch.setattr(
        compiler, "subprocess", SimpleNamespace(run=run, TimeoutExpired=TimeoutError)
    )
    monkeypatch.setattr(
        compiler,
        "parse_ptxas",
        lambda stderr, name: PtxasReport(name, "sm_90", 128, 0, 0, 0, 0, 1),
    )
    monkeypatch.setattr(
        compiler,
        "read_launch_info",
        lambda cubin, symbol="": LaunchInfo(1, 0, 128, 0, 0, 128, 64, 256, 65536),
    )
    return runs


def sm90_config() -> ValidConfig:
    return load_space("sm90").valid_configs(H200, P.space_values())[-1]


# -- the build stage takes a ValidConfig as it is ---------------------------------------------


def test_build_key_compile_codegen_and_naming_do_not_check_a_valid_config_again(
    checks: Checks, fake_nvcc: list[list[str]]
) -> None:
    config = sm90_config()
    space = config.space
    with checks:
        source = render(config)
        name, traits = space.name_of(config), space.traits_of(config)
        key = build_key(config, H200)
        build = compile_config(config, H200)
        assert lookup(config, H200) is not None and build.name == name
    assert build.ok and build.key == key and len(fake_nvcc) == 1
    assert build.config is config and source.name == name and traits in source.text
    assert checks.domain == Counter()
    assert checks.target == 2  # compile_config's and lookup's: whether it fits this GPU


def test_a_plain_config_is_checked_once_where_it_enters_the_build(
    checks: Checks, fake_nvcc: list[list[str]]
) -> None:
    plain = Config.from_json(sm90_config().to_json())  # as read from a file or the CLI
    assert type(plain) is Config
    with checks:
        build = compile_config(plain, H200)
    assert build.ok and isinstance(build.config, ValidConfig) and build.config == plain
    assert sum(checks.domain.values()) == 1 and checks.target == 1
    with checks:
        (again,) = compile_many([plain], H200)  # a cache hit, answered in this process
    assert again.cached and isinstance(again.config, ValidConfig)
    assert sum(checks.domain.values()) == 1 and checks.target == 1
    broken = plain.replace(block_m=100)  # not a value of the space: invalid, not compiled
    with checks:
        refused = compile_config(broken, H200)
    assert refused.status == "invalid" and "block_m = 100" in refused.message
    assert sum(checks.domain.values()) == 1 and len(fake_nvcc) == 1


# -- the first attention() call ---------------------------------------------------------------


class FakeKernel:
    """A loaded kernel without a GPU: its prepared launch launches nothing."""

    num_splits = 1

    def __init__(self, build: Any, device: int = 0) -> None:
        self.config = build.config

    def prepare(
        self, problem: Problem, q: Any, k: Any, v: Any, *, scale: float | None, layout: str
    ) -> Any:
        return SimpleNamespace(run=lambda *tensors, **kw: None)


@pytest.fixture
def first_call(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_nvcc: list[list[str]]
) -> Iterator[Callable[[], Any]]:
    """attention()'s first-call path (`_prepare`) for a problem tuned in the database, on
    meta tensors standing in for a GPU's: decide, compile (a miss), load, plan."""
    monkeypatch.setattr(dispatch_module, "shipped_results", lambda: [])
    monkeypatch.setattr(dispatch_module, "CompiledKernel", FakeKernel)
    db = f"sqlite:///{tmp_path}/user.db"
    tuned = TrialResult(sm90_config(), Status.OK, median_us=250.0)
    TuningStore(db).set_best(
        H200_DEVICE,
        P,
        tuned,
        measurement_id=None,
        study="s",
        trials=30,
        sdpa_default_us=500.0,
        sdpa_flash_us=None,
    )
    d = Dispatcher(db)
    d._identify = lambda device_index: (H200_DEVICE, H200)  # type: ignore[method-assign]
    monkeypatch.setattr(attention_module, "_dispatcher", d)
    # the inputs as a GPU's (read_inputs would send meta tensors to torch SDPA)
    monkeypatch.setattr(
        attention_module,
        "read_inputs",
        lambda q, k, v, *, causal, layout: (
            read_problem(q, k, v, causal=causal, layout=layout),
            None,
        ),
    )
    q = torch.empty(4, 16, 2048, 128, dtype=torch.float16, device="meta")

    def call() -> Any:
        prepared, reason = attention_module._prepare(
            q, q, q, causal=False, scale=None, layout="bhld"
        )
        assert prepared is not None, reason
        return prepared

    yield call


def test_the_first_attention_call_checks_each_config_once_where_it_enters(
    checks: Checks, first_call: Callable[[], Any], fake_nvcc: list[list[str]]
) -> None:
    with checks:
        prepared = first_call()
    assert prepared.kernel is not None and len(fake_nvcc) == 1  # decided, compiled, planned
    decision = attention_module.dispatcher().decide(P, 0)
    assert decision.path == "exact" and isinstance(decision.config, ValidConfig)
    later = {asker: n for asker, n in checks.domain.items() if not asker.startswith(ENTRIES)}
    assert later == {}, f"re-validated after entering: {later}"
    assert sum(checks.domain.values()) <= 3  # the stored row (best, nearest), the heuristic
    assert checks.target == 2  # dispatch's (does it fit this GPU?) and compile_config's
    with checks:
        first_call()
        decision.describe()
    assert checks.domain == Counter() and checks.target == 0  # decided once per problem
