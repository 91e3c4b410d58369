"""Where trials run. A tuning session talks to one Backend and never knows which:

* GpuBackend compiles with a process pool on this host (never while a trial is being timed)
  and validates and times every trial in a GPU worker process that may crash or hang without
  taking the session down (measure.trial.evaluate, sent as a typed request).
* ReplayBackend serves measurements recorded on a real GPU (benchmarks/sweep.py, one recording
  per kernel family, made by the same measure.trial.evaluate), so that the whole loop (search,
  database, warm start, re-ranking, failures, best query) runs without one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .._jsonfile import read_json
from ..build.compiler import BuildResult, compile_many
from ..build.compiler import build_key as current_build_key
from ..build.ptxas import PtxasReport
from ..measure.environment import Environment
from ..measure.protocol import (
    BaselinesRequest,
    DeviceRequest,
    RerankRequest,
    TrialRequest,
)
from ..measure.trial import not_built
from ..measure.worker import WorkerFailure
from ..model.config import Config, InvalidConfig
from ..model.problem import Problem
from ..model.space import SDPA_FAMILY as SDPA_FAMILY  # re-exported: the tune stage's name
from ..model.space import load_space, supported_families
from ..model.status import Status
from ..model.target import Target, target_for_capability
from ..store.records import BaselineTiming, DeviceInfo, TrialResult

# Build keys of the replay backend: a recorded measurement, not a build of this machine.
REPLAY_KEY_PREFIX = "replay-"


@dataclass(frozen=True)
class Reranking:
    """Finalists re-timed together, in the order given (torch SDPA's backends among them as
    configs of family `sdpa`), and the SDPA configs' timings again as baselines by backend."""

    results: list[TrialResult]
    baselines: list[BaselineTiming] = field(default_factory=list)


def sdpa_baselines(results: Sequence[TrialResult]) -> list[BaselineTiming]:
    """The timed SDPA configs among re-ranked results, as baselines by backend."""
    return [
        BaselineTiming(
            str(r.config["backend"]),
            r.median_us,
            r.p20_us or r.median_us,
            r.p80_us or r.median_us,
            r.env,
        )
        for r in results
        if r.config.family == SDPA_FAMILY and r.ok and r.median_us is not None
    ]


class Backend(Protocol):
    def device(self) -> DeviceInfo: ...

    def target(self) -> Target: ...

    def families(self) -> list[str]:
        """The kernel families this backend can build and time: those its target supports."""
        ...

    def build(self, configs: Sequence[Config]) -> list[BuildResult]:
        """Compile ahead of timing (statically valid configs only)."""
        ...

    def build_key(self, config: Config) -> str:
        """The key the build of `config` will have, without building it."""
        ...

    def evaluate(
        self, problem: Problem, build: BuildResult, *, rounds: int, round_ms: float
    ) -> TrialResult:
        """Validate then time one built config."""
        ...

    def rerank(
        self, problem: Problem, builds: Sequence[BuildResult], *, rounds: int, round_ms: float
    ) -> Reranking:
        """Re-time finalists, interleaved so drift hits them alike (and SDPA with them)."""
        ...

    def baselines(self, problem: Problem) -> list[BaselineTiming]: ...

    def close(self) -> None: ...


def _baselines_from_recording(timings: Mapping[str, Any]) -> list[BaselineTiming]:
    return [
        BaselineTiming(
            name, t["median_us"], t["p20_us"], t["p80_us"], Environment.from_dict(t.get("env"))
        )
        for name, t in timings.items()
    ]


def _failed(build: BuildResult, failure: WorkerFailure) -> TrialResult:
    """A trial the worker could not answer (it hung, died or raised)."""
    return TrialResult(build.config, failure.status, failure.reason, build_key=build.key)


class GpuBackend:
    """Trials in a GPU worker process, through measure.trial (the one trial procedure)."""

    def __init__(
        self, device: int = 0, *, jobs: int | None = None, trial_timeout: float = 120.0
    ) -> None:
        from ..measure.worker import GpuWorker

        self._worker = GpuWorker(device)
        self._jobs = jobs
        self._timeout = trial_timeout
        self._device: DeviceInfo | None = None
        self._target: Target | None = None

    def _describe(self) -> None:
        reply = self._worker.request(DeviceRequest(), timeout=60)
        if isinstance(reply, WorkerFailure):
            raise RuntimeError(f"cannot query the GPU: {reply.reason}")
        self._device = reply.info
        base = target_for_capability(reply.info.compute_capability)
        self._target = Target(
            base.cc, reply.max_smem_per_block or base.max_smem_per_block, reply.info.name
        )

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

    def families(self) -> list[str]:
        return supported_families(self.target())

    def build(self, configs: Sequence[Config]) -> list[BuildResult]:
        return compile_many(configs, self.target(), jobs=self._jobs)

    def build_key(self, config: Config) -> str:
        return current_build_key(config, self.target())

    def evaluate(
        self, problem: Problem, build: BuildResult, *, rounds: int, round_ms: float
    ) -> TrialResult:
        if not build.ok:
            return not_built(build)  # what measure.trial.evaluate answers, without a worker
        reply = self._worker.request(
            TrialRequest(problem, build, rounds, round_ms), timeout=self._timeout
        )
        return _failed(build, reply) if isinstance(reply, WorkerFailure) else reply

    def rerank(
        self, problem: Problem, builds: Sequence[BuildResult], *, rounds: int, round_ms: float
    ) -> Reranking:
        reply = self._worker.request(
            RerankRequest(problem, tuple(builds), rounds, round_ms),
            timeout=self._timeout * max(1, len(builds) + 1),
        )
        if isinstance(reply, WorkerFailure):
            return Reranking([_failed(b, reply) for b in builds])
        results = list(reply.results)
        return Reranking(results, sdpa_baselines(results))

    def baselines(self, problem: Problem) -> list[BaselineTiming]:
        reply = self._worker.request(
            BaselinesRequest(problem, rounds=9, round_ms=40), timeout=self._timeout
        )
        if isinstance(reply, WorkerFailure):
            raise RuntimeError(f"timing torch SDPA failed: {reply.reason}")
        return list(reply.timings)

    def close(self) -> None:
        self._worker.close()


class ReplayBackend:
    """Measurements recorded by benchmarks/sweep.py on a real GPU, served as if measured now.

    Takes one recording or several (one per kernel family, all of one GPU); each config is
    served from the recording of its own family, and a config no recording holds fails to
    build ("not recorded"), as a config nvcc refused would.

    `faults` maps config digests to (status, reason) to replay failures (a crash, a hang, a
    wrong result) on top of the recording; `build_calls` lists every config `build` was asked
    for, so tests can prove that statically pruned configs never reach the compiler.
    """

    def __init__(
        self,
        recordings: Path | Mapping[str, Any] | Sequence[Path | Mapping[str, Any]],
        faults: Mapping[str, tuple[str, str]] | None = None,
    ) -> None:
        if isinstance(recordings, (Path, Mapping)):
            recordings = [recordings]
        if not recordings:
            raise ValueError("the replay backend needs at least one recording")
        self.faults = dict(faults or {})
        self.build_calls: list[Config] = []
        self._families: list[str] = []
        self._rows: dict[tuple[str, Problem], dict[str, dict[str, Any]]] = {}
        self._sdpa: dict[Problem, dict[str, Any]] = {}
        self._builds: dict[str, dict[str, Any]] = {}
        self.recordings: list[dict[str, Any]] = []
        for i, recording in enumerate(recordings):
            where = str(recording) if isinstance(recording, Path) else f"recording #{i}"
            data = read_json(recording) if isinstance(recording, Path) else recording
            try:
                if not isinstance(data, Mapping):
                    raise ValueError("not a JSON object")
                if i == 0:
                    self._describe(data["device"])
                self._add(data)
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(
                    f"{where} is not a recording of benchmarks/sweep.py: {exc!s}"
                ) from None
            self.recordings.append(dict(data))

    def _describe(self, dev: Mapping[str, Any]) -> None:
        self._device = DeviceInfo(
            dev["name"],
            dev["compute_capability"],
            dev["sm_count"],
            dev["driver_version"],
            dev["cuda_version"],
        )
        base = target_for_capability(dev["compute_capability"])
        self._target = Target(
            base.cc, dev.get("max_smem_per_block") or base.max_smem_per_block, dev["name"]
        )

    def _add(self, data: Mapping[str, Any]) -> None:
        family = data.get("family")
        if not isinstance(family, str):
            raise ValueError("a recording names the kernel family it measured ('family')")
        dev = data["device"]
        if (dev["name"], dev["compute_capability"], dev["sm_count"]) != (
            self._device.name,
            self._device.compute_capability,
            self._device.sm_count,
        ):
            raise ValueError(
                f"recordings of different GPUs: {dev['name']} "
                f"(sm_{dev['compute_capability']}, {dev['sm_count']} SMs) and "
                f"{self._device.name} (sm_{self._device.compute_capability}, "
                f"{self._device.sm_count} SMs)"
            )
        if family not in self._families:
            self._families.append(family)
        for shape in data["shapes"]:
            problem = Problem(**shape["problem"])
            if (family, problem) in self._rows:
                raise ValueError(f"two {family} recordings of {problem.describe()}")
            rows = {}
            for r in shape["configs"]:
                config = Config.from_dict(r["config"])
                if config.family != family:
                    raise ValueError(f"the {family} recording holds a {config.family} config")
                rows[config.digest] = r
            self._rows[(family, problem)] = rows
            self._sdpa.setdefault(problem, shape["sdpa"])
            for digest, row in rows.items():
                self._builds.setdefault(digest, row)

    @property
    def problems(self) -> list[Problem]:
        """Every recorded problem, in the order of the recordings."""
        return list(self._sdpa)

    def require_recorded(self, problems: Sequence[Problem]) -> None:
        """ValueError naming the problems no recording holds (a session cannot replay them),
        so that a session refuses them before it starts rather than midway."""
        missing = [p for p in problems if p not in self._sdpa]
        if missing:
            raise ValueError(self._not_recorded(missing))

    def rows(self, problem: Problem, family: str | None = None) -> list[dict[str, Any]]:
        """The recorded rows of a problem: of one family, or of every family."""
        return [
            row
            for (f, p), rows in self._rows.items()
            if p == problem and family in (None, f)
            for row in rows.values()
        ]

    def device(self) -> DeviceInfo:
        return self._device

    def target(self) -> Target:
        return self._target

    def families(self) -> list[str]:
        """The recorded families the recorded GPU supports."""
        return [f for f in supported_families(self._target) if f in self._families]

    def build(self, configs: Sequence[Config]) -> list[BuildResult]:
        results = []
        for config in configs:
            self.build_calls.append(config)
            if not load_space(config.family).compiled:
                results.append(BuildResult(config, self._target.arch, Status.OK, cached=True))
                continue
            row = self._builds.get(config.digest)
            if row is None or "registers" not in row:
                status = Status(row["status"]) if row else Status.COMPILE_ERROR
                message = (row or {}).get("reason", "not recorded")
                if row is None and config.family not in self._families:
                    message += f" (no {config.family} recording)"
                results.append(BuildResult(config, self._target.arch, status, message=message))
                continue
            ptxas = PtxasReport(
                "cute_autotune_fwd",
                self._target.arch,
                row["registers"],
                0,
                row.get("spill_stores", 0),
                row.get("spill_loads", 0),
                0,
                1,
            )
            results.append(
                BuildResult(
                    config, self._target.arch, Status.OK, key=self.build_key(config), ptxas=ptxas
                )
            )
        return results

    def build_key(self, config: Config) -> str:
        """One key per recorded build: configs that differ only in launch parameters (the
        decode families' split count) share it, as their cubin does on a GPU."""
        space = load_space(config.family)
        try:
            digest = space.build_view(space.validate(config)).digest
        except InvalidConfig:
            digest = config.digest
        return f"{REPLAY_KEY_PREFIX}{digest}"

    def evaluate(
        self, problem: Problem, build: BuildResult, *, rounds: int, round_ms: float
    ) -> TrialResult:
        if not build.ok:
            return not_built(build)
        config = build.config
        if config.digest in self.faults:
            status, reason = self.faults[config.digest]
            return TrialResult(config, Status(status), reason, build_key=build.key)
        if problem not in self._sdpa:
            raise ValueError(self._not_recorded([problem]))
        if config.family == SDPA_FAMILY:  # served from the recording's SDPA timings
            timing = self._sdpa[problem].get(str(config["backend"]))
            if timing is None:
                return TrialResult(
                    config,
                    Status.INVALID,
                    f"torch SDPA's {config['backend']} "
                    "backend refuses this problem (not in the recording)",
                    build_key=build.key,
                )
            return TrialResult(
                config,
                Status.OK,
                "",
                timing["median_us"],
                timing.get("p20_us", timing["median_us"]),
                timing.get("p80_us", timing["median_us"]),
                rounds,
                build_key=build.key,
            )
        row = self._rows.get((config.family, problem), {}).get(config.digest)
        if row is None:
            return TrialResult(
                config, Status.INVALID, "not in the recorded space", build_key=build.key
            )
        # The trial's relative error; recordings made before the sweep ran measure.trial name
        # it rel_err_vs_sdpa, and a failed validation wrong_result.
        rel_err = row.get("rel_err", row.get("rel_err_vs_sdpa"))
        if row.get("median_us") is None:
            status = Status(row["status"])
            return TrialResult(
                config,
                Status.FAILED_VALIDATION if status is Status.WRONG_RESULT else status,
                row.get("reason", ""),
                rel_err=rel_err,
                build_key=build.key,
            )
        return TrialResult(
            config,
            Status.OK,
            "",
            row["median_us"],
            row["p20_us"],
            row["p80_us"],
            rounds,
            rel_err,
            build_key=build.key,
            baseline_us=row.get("baseline_us"),
        )

    def rerank(
        self, problem: Problem, builds: Sequence[BuildResult], *, rounds: int, round_ms: float
    ) -> Reranking:
        results = [self.evaluate(problem, b, rounds=rounds, round_ms=round_ms) for b in builds]
        return Reranking(results, sdpa_baselines(results))

    def baselines(self, problem: Problem) -> list[BaselineTiming]:
        sdpa = self._sdpa.get(problem)
        if sdpa is None:
            raise ValueError(self._not_recorded([problem]))
        return _baselines_from_recording(sdpa)

    def _not_recorded(self, problems: Sequence[Problem]) -> str:
        named = ", ".join(p.describe() for p in problems[:3])
        if len(problems) > 3:
            named += f" and {len(problems) - 3} more"
        held = "; ".join(
            f"{p.describe()} ({', '.join(f for f, q in self._rows if q == p)})" for p in self._sdpa
        )
        return (
            f"{named} {'is' if len(problems) == 1 else 'are'} not recorded in the replayed "
            f"recordings, which hold {len(self._sdpa)} problems: {held}"
        )

    def close(self) -> None:
        pass
