"""The settings of a tuning session: how configs are proposed (the strategy), how many are
tried, how each is timed and how the finalists are re-timed."""

from __future__ import annotations

from dataclasses import dataclass

SAMPLERS = ("tpe", "grid", "random", "model")


@dataclass(frozen=True)
class SearchSettings:
    sampler: str = "tpe"
    seed: int = 0
    # Configs to evaluate per family searched: new ones, added to what the study already holds;
    # with `resume`, the study's budget: the trials of today's builds it already ran count.
    trials: int = 40
    resume: bool = False
    time_budget_s: float | None = None  # seconds of search per family
    batch_size: int = 4  # configs compiled together before the GPU times them
    rounds: int = 5
    round_ms: float = 20.0
    rerank_top: int = 5
    rerank_rounds: int = 11
    rerank_round_ms: float = 30.0
    reuse: bool = True  # serve configs already measured on this device and build from the store
    warm_start: int = 3  # best configs of the nearest tuned problems, tried first
    tpe_startup: int = 5  # random trials before TPE models the space
    local_search: bool = True  # half of each TPE batch: neighbours of the incumbent
    seed_heuristic: bool = True  # try the family's default config for the problem class first
    # Every value of a family's launch parameters (the KV split count) timed on each build the
    # search makes, queued right after it: they cost no compile, and a build counts once
    # against `trials` (not the grid sampler, which tries everything anyway).
    sweep_launch: bool = True
    # torch SDPA's backends join the final re-ranking (the stored best may be SDPA itself);
    # off only to study the kernels' search alone.
    sdpa_finalists: bool = True
    # The model sampler (tune/model_seeding.py): the performance model it ranks with (a JSON
    # file; None: the one shipped in db/ for the GPU) and how many builds it compiles in all,
    # together, before timing any (`trials` caps each family's share).
    perf_model: str | None = None
    prebuild: int = 12

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        if self.trials < 1 or self.batch_size < 1 or self.rerank_top < 1 or self.prebuild < 1:
            raise ValueError("trials, batch_size, rerank_top and prebuild must be >= 1")
