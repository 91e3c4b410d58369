"""The counters of a search, one type for every stage that reports them: the loop's running
progress, what one family's search left for the final re-timing, and a problem's session (the
sum over its families). Each holder reads them as its own attributes (`outcome.evaluated`)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class SearchCounts:
    """What a search did. Mutable while the loop runs; a finished search's counts are copied."""

    evaluated: int = 0  # configs timed now (`swept` among them)
    failed: int = 0  # of `evaluated`: did not build, launch or validate
    pruned: int = 0  # proposals refused before any build (invalid in the space)
    reused: int = 0  # proposals answered from the store (measured before, same build)
    total_trials: int = 0  # the study's measured trials, this session's and earlier ones
    repeated: int = 0  # proposals of a config already measured: told its value, not run
    optuna_trials: int = 0  # Optuna's count: total_trials + pruned + repeated + interrupted
    swept: int = 0  # of `evaluated`: launch values timed on a build already made (no compile)

    def __add__(self, other: SearchCounts) -> SearchCounts:
        return SearchCounts(
            *(getattr(self, f.name) + getattr(other, f.name) for f in fields(self))
        )


class Counted:
    """The counters of `self.counts` read as attributes of the holder."""

    counts: SearchCounts

    @property
    def evaluated(self) -> int:
        return self.counts.evaluated

    @property
    def failed(self) -> int:
        return self.counts.failed

    @property
    def pruned(self) -> int:
        return self.counts.pruned

    @property
    def reused(self) -> int:
        return self.counts.reused

    @property
    def total_trials(self) -> int:
        return self.counts.total_trials

    @property
    def repeated(self) -> int:
        return self.counts.repeated

    @property
    def optuna_trials(self) -> int:
        return self.counts.optuna_trials

    @property
    def swept(self) -> int:
        return self.counts.swept
