"""A tuning session that is killed (SIGKILL) mid-study, run as its own process:

    python -m tests.faults.killed_session DB_URL WHERE N TRIALS

WHERE is `evaluate` (dies while timing its Nth trial: the rest of its batch is left RUNNING),
`recorded` (dies right after its Nth measurement is stored, before Optuna is told) or `failed`
(its Nth trial fails validation, and it dies right after that failure is stored, before Optuna
is told)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from autotune.model.status import Status
from autotune.store.records import TrialResult
from autotune.store.repo import TuningStore
from autotune.tune.backends import ReplayBackend
from autotune.tune.search import SearchSettings, tune_problem

RECORDING = Path(__file__).resolve().parents[2] / "tests" / "data" / "sweep_sm80_h200.json"
INJECTED = "output disagrees with the reference (injected)"


def failing_validation(result: TrialResult) -> TrialResult:
    """`result` turned into a run of its config that failed validation (a stored result, not
    OK)."""
    return TrialResult(
        result.config, Status.FAILED_VALIDATION, INJECTED, build_key=result.build_key
    )


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(url: str, where: str, n: int, trials: int) -> None:
    count = {"evaluate": 0, "recorded": 0}

    class Killer(ReplayBackend):
        def evaluate(self, *args: Any, **kwargs: Any) -> Any:
            count["evaluate"] += 1
            if where == "evaluate" and count["evaluate"] == n:
                die()
            result: TrialResult = super().evaluate(*args, **kwargs)
            if where == "failed" and count["evaluate"] == n:
                return failing_validation(result)
            return result

    class KilledStore(TuningStore):
        def record_trial(
            self, device: Any, problem: Any, result: TrialResult, **kwargs: Any
        ) -> int:
            row = super().record_trial(device, problem, result, **kwargs)
            count["recorded"] += 1
            if (
                where == "recorded"
                and count["recorded"] == n
                or (where == "failed" and not result.ok)
            ):
                die()
            return row

    backend = Killer(RECORDING)
    tune_problem(
        backend.problems[0],
        backend,
        KilledStore(url),
        SearchSettings(trials=trials, seed=7, batch_size=4, warm_start=0),
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
