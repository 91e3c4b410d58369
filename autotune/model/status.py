"""The one vocabulary for outcomes: of a build, a validation, a timing, a trial of the search.

Values are the strings stored in the database and carried by recordings, so a `Status` compares
equal to its stored string and old rows read back unchanged."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    # Building a config (build stage).
    OK = "ok"  # built, or (for a trial) validated and timed
    INVALID = "invalid"  # refused by the space's constraints (or by every SDPA backend) unrun
    COMPILE_ERROR = "compile_error"  # nvcc or ptxas said no: the config's own fault
    TIMEOUT = "timeout"  # the build or the GPU request ran past its limit
    INFRASTRUCTURE = "infrastructure"  # the machine failed (compile pool, toolchain)
    # Running on the GPU (measure stage).
    CRASHED = "crashed"  # the worker process died (illegal address, a poisoned context)
    ERROR = "error"  # the request raised
    FAILED_VALIDATION = "failed_validation"  # ran, and the output disagrees with the reference
    WRONG_RESULT = "wrong_result"  # the same, as the recording sweep names it
    PASSED = "passed"  # validation alone (the check command) passed
    FAILED = "failed"  # validation alone failed
    NOT_RUN = "not_run"  # validation skipped: the build did not succeed
    # Search bookkeeping (tune stage).
    REPEAT = "repeat"  # a config the search already evaluated in this study
    REUSED = "reused"  # taken from an earlier measurement instead of run again
    INTERRUPTED = "interrupted"  # the session stopped while the trial ran

    @property
    def ok(self) -> bool:
        return self in (Status.OK, Status.PASSED)

    @property
    def config_at_fault(self) -> bool:
        """Outcomes that condemn the config itself (as opposed to the machine or the session)."""
        return self in (
            Status.INVALID,
            Status.COMPILE_ERROR,
            Status.TIMEOUT,
            Status.CRASHED,
            Status.FAILED_VALIDATION,
            Status.WRONG_RESULT,
            Status.FAILED,
        )
