"""Where trials run. A tuning session talks to one Backend and never knows which:

* GpuBackend compiles with a process pool on this host (never while a trial is being timed)
  and validates and times every trial in a GPU worker process that may crash or hang without
  taking the session down.
* ReplayBackend serves measurements recorded on a real GPU (benchmarks/sweep.py), so that the
  whole loop (search, database, warm start, re-ranking, failures, best query) runs without one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from .cache import artifact_key
from .compiler import NVCC_FLAGS, OK, BuildResult, compile_many
from .config import Config
from .problem import Problem
from .ptxas import PtxasReport
from .space import load_space
from .store.records import BaselineTiming, DeviceInfo, TrialResult
from .target import Target, target_for_arch
from .toolchain import toolchain


class Backend(Protocol):
    def device(self) -> DeviceInfo: ...

    def target(self) -> Target: ...

    def build(self, configs: Sequence[Config]) -> list[BuildResult]:
        """Compile ahead of timing (statically valid configs only)."""
        ...

    def build_key(self, config: Config) -> str:
        """The key the build of `config` will have, without building it."""
        ...

    def evaluate(self, problem: Problem, build: BuildResult, *, rounds: int,
                 round_ms: float) -> TrialResult:
        """Validate then time one built config."""
        ...

    def rerank(self, problem: Problem, builds: Sequence[BuildResult], *, rounds: int,
               round_ms: float) -> list[TrialResult]:
        """Re-time finalists, interleaved so drift hits them alike."""
        ...

    def baselines(self, problem: Problem) -> list[BaselineTiming]: ...

    def close(self) -> None: ...


def _trial_from_reply(config: Config, build: BuildResult, reply: Mapping[str, Any]
                      ) -> TrialResult:
    return TrialResult(
        config=config, status=str(reply.get("status", "error")),
        reason=str(reply.get("reason", "")), median_us=reply.get("median_us"),
        p20_us=reply.get("p20_us"), p80_us=reply.get("p80_us"), rounds=reply.get("rounds"),
        rel_err=reply.get("rel_err"), build_key=build.key)


class GpuBackend:
    def __init__(self, device: int = 0, *, jobs: int | None = None,
                 trial_timeout: float = 120.0) -> None:
        from .worker import GpuWorker

        self._worker = GpuWorker(device)
        self._jobs = jobs
        self._timeout = trial_timeout
        self._device: DeviceInfo | None = None
        self._target: Target | None = None

    def _describe(self) -> None:
        reply = self._worker.request("device_info", {}, timeout=60)
        if reply.get("status") != "ok":
            raise RuntimeError(f"cannot query the GPU: {reply.get('reason')}")
        self._device = DeviceInfo(reply["name"], reply["compute_capability"],
                                  reply["sm_count"], reply["driver_version"],
                                  reply["cuda_version"])
        base = target_for_arch(reply["compute_capability"])
        self._target = Target(base.cc, reply["max_smem_per_block"] or base.max_smem_per_block,
                              reply["name"])

    def device(self) -> DeviceInfo:
        if self._device is None:
            self._describe()
        assert self._device is not None
        return self._device

    def target(self) -> Target:
        if self._target is None:
            self._describe()
        assert self._target is not None
        return self._target

    def build(self, configs: Sequence[Config]) -> list[BuildResult]:
        return compile_many(configs, self.target(), jobs=self._jobs)

    def build_key(self, config: Config) -> str:
        space = load_space(config.family)
        return artifact_key(config, space.gencode_for(self.target()), space.source_hash(),
                            toolchain(), NVCC_FLAGS)

    def _payload(self, problem: Problem, **extra: Any) -> dict[str, Any]:
        return {"problem": problem.as_dict(), "target": vars(self.target()), **extra}

    def evaluate(self, problem: Problem, build: BuildResult, *, rounds: int,
                 round_ms: float) -> TrialResult:
        if not build.ok:
            return TrialResult(build.config, build.status, build.message, build_key=build.key)
        reply = self._worker.request(
            "trial", self._payload(problem, config=build.config.to_json(), rounds=rounds,
                                   round_ms=round_ms), timeout=self._timeout)
        return _trial_from_reply(build.config, build, reply)

    def rerank(self, problem: Problem, builds: Sequence[BuildResult], *, rounds: int,
               round_ms: float) -> list[TrialResult]:
        configs = [b.config.to_json() for b in builds]
        reply = self._worker.request(
            "rerank", self._payload(problem, configs=configs, rounds=rounds,
                                    round_ms=round_ms),
            timeout=self._timeout * max(1, len(builds)))
        if reply.get("status") != "ok":
            return [TrialResult(b.config, str(reply.get("status")), str(reply.get("reason")),
                                build_key=b.key) for b in builds]
        results = []
        for build in builds:
            t = reply["timings"][build.config.to_json()]
            results.append(TrialResult(build.config, OK, "", t["median_us"], t["p20_us"],
                                       t["p80_us"], t["rounds"], build_key=build.key))
        return results

    def baselines(self, problem: Problem) -> list[BaselineTiming]:
        reply = self._worker.request("baselines", self._payload(problem, rounds=9, round_ms=40),
                                     timeout=self._timeout)
        if reply.get("status") != "ok":
            raise RuntimeError(f"timing torch SDPA failed: {reply.get('reason')}")
        return [BaselineTiming(name, t["median_us"], t["p20_us"], t["p80_us"])
                for name, t in reply["timings"].items()]

    def close(self) -> None:
        self._worker.close()


class ReplayBackend:
    """Measurements recorded by benchmarks/sweep.py on a real GPU, served as if measured now.

    `faults` maps config digests to (status, reason) to replay failures (a crash, a hang, a
    wrong result) on top of the recording; `build_calls` lists every config `build` was asked
    for, so tests can prove that statically pruned configs never reach the compiler.
    """

    def __init__(self, recording: Path | Mapping[str, Any],
                 faults: Mapping[str, tuple[str, str]] | None = None) -> None:
        data = json.loads(Path(recording).read_text()) if isinstance(recording, Path) \
            else dict(recording)
        self.recording = data
        dev = data["device"]
        self._device = DeviceInfo(dev["name"], dev["compute_capability"], dev["sm_count"],
                                  dev["driver_version"], dev["cuda_version"])
        base = target_for_arch(dev["compute_capability"])
        self._target = Target(base.cc, dev.get("max_smem_per_block") or base.max_smem_per_block,
                              dev["name"])
        self.faults = dict(faults or {})
        self.build_calls: list[Config] = []
        self._shapes: dict[Problem, dict[str, Any]] = {}
        self._builds: dict[str, dict[str, Any]] = {}
        for shape in data["shapes"]:
            problem = Problem(**shape["problem"])
            rows = {Config.from_dict(r["config"]).digest: r for r in shape["configs"]}
            self._shapes[problem] = {"rows": rows, "sdpa": shape["sdpa"]}
            for digest, row in rows.items():
                self._builds.setdefault(digest, row)

    @property
    def problems(self) -> list[Problem]:
        return list(self._shapes)

    def device(self) -> DeviceInfo:
        return self._device

    def target(self) -> Target:
        return self._target

    def build(self, configs: Sequence[Config]) -> list[BuildResult]:
        results = []
        for config in configs:
            self.build_calls.append(config)
            row = self._builds.get(config.digest)
            if row is None or "registers" not in row:
                status = row["status"] if row else "compile_error"
                results.append(BuildResult(config, self._target.arch, status,
                                           message=(row or {}).get("reason", "not recorded")))
                continue
            ptxas = PtxasReport("cute_autotune_fwd", self._target.arch, row["registers"], 0,
                                row.get("spill_stores", 0), row.get("spill_loads", 0), 0, 1)
            results.append(BuildResult(config, self._target.arch, OK,
                                       key=self.build_key(config), ptxas=ptxas))
        return results

    def build_key(self, config: Config) -> str:
        return f"replay-{config.digest}"

    def _row(self, problem: Problem, config: Config) -> dict[str, Any]:
        shape = self._shapes.get(problem)
        if shape is None:
            known = "; ".join(p.describe() for p in self._shapes)
            raise KeyError(f"no recording of {problem.describe()} (recorded: {known})")
        row = shape["rows"].get(config.digest)
        if row is None:
            return {"status": "invalid", "reason": "not in the recorded space"}
        return dict(row)

    def evaluate(self, problem: Problem, build: BuildResult, *, rounds: int,
                 round_ms: float) -> TrialResult:
        if not build.ok:
            return TrialResult(build.config, build.status, build.message, build_key=build.key)
        if build.config.digest in self.faults:
            status, reason = self.faults[build.config.digest]
            return TrialResult(build.config, status, reason, build_key=build.key)
        row = self._row(problem, build.config)
        if row.get("median_us") is None:
            return TrialResult(build.config, "failed_validation" if row["status"] == "wrong_result"
                               else row["status"], row.get("reason", ""), build_key=build.key)
        return TrialResult(build.config, OK, "", row["median_us"], row["p20_us"], row["p80_us"],
                           rounds, row.get("rel_err_vs_sdpa"), build_key=build.key)

    def rerank(self, problem: Problem, builds: Sequence[BuildResult], *, rounds: int,
               round_ms: float) -> list[TrialResult]:
        return [self.evaluate(problem, b, rounds=rounds, round_ms=round_ms) for b in builds]

    def baselines(self, problem: Problem) -> list[BaselineTiming]:
        shape = self._shapes.get(problem)
        if shape is None:
            raise KeyError(f"no recording of {problem.describe()}")
        return [BaselineTiming(name, t["median_us"], t["p20_us"], t["p80_us"])
                for name, t in shape["sdpa"].items()]

    def close(self) -> None:
        pass


def space_size(problem: Problem, target: Target, family: str = "sm80") -> int:
    return len(load_space(family).valid_configs(target, problem.space_values()))
