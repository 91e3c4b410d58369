"""The search strategies alone (tune/strategies.py), on an in-memory study of the sm80 space and
a made-up cost per config: what each proposes, what it promises not to propose, when it stops.
The loop's part (pruning, building, timing, recording) is covered by
tests/tune/test_search_replay.py.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest

from autotune.model.config import Config, InvalidConfig
from autotune.model.problem import Problem
from autotune.model.space import Space, load_space
from autotune.model.status import Status
from autotune.model.target import Target, target_for_capability
from autotune.tune.settings import SearchSettings
from autotune.tune.strategies import (
    GridSearch,
    LocalSearch,
    SamplerSearch,
    Strategy,
    WarmStart,
    neighbours,
    sampler_for,
    strategy_for,
)
from autotune.tune.study import Outcome, Proposal, Study

optuna.logging.set_verbosity(optuna.logging.WARNING)

PROBLEM = Problem(4, 16, 16, 2048, 2048, 128, "fp16", False)
TARGET = target_for_capability(90)
SPACE = load_space("sm80")
FIXED = PROBLEM.space_values()
VALID = SPACE.valid_configs(TARGET, FIXED)

# The strategies a session can run, by the settings that choose them (tune.loop builds them
# through strategy_for, as here).
SETTINGS = {
    "tpe": SearchSettings(sampler="tpe", local_search=False, tpe_startup=3),
    "tpe+local": SearchSettings(sampler="tpe", local_search=True, tpe_startup=3),
    "random": SearchSettings(sampler="random"),
    "grid": SearchSettings(sampler="grid"),
}


def cost(config: Config) -> float:
    """A made-up time (us) for a valid config: distinct for each, spread over the space."""
    return 100.0 + (VALID.index(config) * 37) % len(VALID)


def open_study(settings: SearchSettings, name: str = "s", url: str | None = None) -> Study:
    return Study(name, url, sampler_for(settings), SPACE, FIXED)


def tell_as_the_loop(
    strategy: Strategy, proposal: Proposal, known: dict[str, float | None]
) -> None:
    """Tell a proposal what the loop would: pruned when invalid, a repeat when known, else its
    cost."""
    config = proposal.config
    reasons = SPACE.violations(config, TARGET)
    if reasons:
        strategy.tell(proposal, Outcome(Status.INVALID, reason="; ".join(reasons), pruned=True))
    elif config.digest in known:
        strategy.tell(proposal, Outcome(Status.REPEAT, known[config.digest]))
    else:
        known[config.digest] = cost(config)
        strategy.tell(proposal, Outcome(Status.OK, cost(config)))


def run(
    strategy: Strategy,
    proposals: int,
    batch: int = 4,
    known: dict[str, float | None] | None = None,
) -> list[Proposal]:
    """Up to `proposals` proposals in batches, each told as the loop would; fewer when the
    strategy stops."""
    known = {} if known is None else known
    made: list[Proposal] = []
    while len(made) < proposals:
        strategy.begin_batch(batch)
        for _ in range(min(batch, proposals - len(made))):
            proposal = strategy.propose()
            if proposal is None:
                return made
            made.append(proposal)
            tell_as_the_loop(strategy, proposal, known)
    return made


@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_proposal_is_a_config_of_the_space_for_the_problem(name: str) -> None:
    settings = SETTINGS[name]
    study = open_study(settings)
    made = run(strategy_for(settings, study, TARGET, {}), 40)
    assert len(made) == 40
    for proposal in made:
        assert SPACE.validate(proposal.config) == proposal.config  # every value allowed
        assert all(proposal.config[k] == v for k, v in FIXED.items())
    if name == "grid":  # a queue of valid configs: nothing for the loop to prune
        assert all(SPACE.is_valid(p.config, TARGET) for p in made)
    assert len({p.number for p in made}) == len(made)  # each a trial of its own


def test_a_config_outside_the_space_is_refused() -> None:
    """The check above can fail: a value the space does not allow is refused."""
    with pytest.raises(InvalidConfig):
        SPACE.validate(VALID[0].replace(block_m=3))


def test_grid_proposes_every_valid_config_once_then_stops() -> None:
    settings = SETTINGS["grid"]
    study = open_study(settings)
    grid = strategy_for(settings, study, TARGET, {})
    assert isinstance(grid, GridSearch)
    made = run(grid, 10 * len(VALID), batch=7)
    assert [p.config for p in made] == VALID  # all, once each, in the space's order
    assert grid.propose() is None  # and stays stopped


def test_grid_leaves_out_what_the_study_measured() -> None:
    settings = SETTINGS["grid"]
    known: dict[str, float | None] = {c.digest: cost(c) for c in VALID[::3]}
    known[VALID[1].digest] = None  # failed under today's build: not tried again either
    made = run(
        strategy_for(settings, open_study(settings), TARGET, known),
        10 * len(VALID),
        known=dict(known),
    )
    assert [p.config for p in made] == [c for c in VALID if c.digest not in known]


def test_a_grid_resumed_later_goes_on_where_it_stopped(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    settings = SETTINGS["grid"]
    first = strategy_for(settings, open_study(settings, url=url), TARGET, {})
    done = run(first, 5)
    # the next session: what the first one measured is known, the rest is still queued
    known: dict[str, float | None] = {p.config.digest: cost(p.config) for p in done}
    again = run(
        strategy_for(settings, open_study(settings, url=url), TARGET, known), 6, known=dict(known)
    )
    assert [p.config for p in done + again] == VALID[:11]


@pytest.mark.parametrize("inner", ["tpe", "tpe+local", "random"])
def test_warm_start_proposes_the_earlier_best_first(inner: str) -> None:
    settings = SETTINGS[inner]
    study = open_study(settings)
    # an earlier session measured some configs (so local search has neighbours to queue)
    known: dict[str, float | None] = {c.digest: cost(c) for c in VALID[40:46]}
    earlier_best = min(VALID[10:30], key=cost)
    default = SPACE.heuristic(FIXED)
    assert default is not None and default != earlier_best and default.digest not in known
    seeds = [earlier_best, default, earlier_best, VALID[40]]  # a repeat, and a known one
    strategy = strategy_for(settings, study, TARGET, known, seeds)
    assert isinstance(strategy, WarmStart)
    made = run(strategy, 8, known=dict(known))
    assert [p.config for p in made[:2]] == [earlier_best, default]
    assert VALID[40] not in [p.config for p in made[:2]]


def test_warm_start_without_seeds_is_the_plain_strategy() -> None:
    settings = SETTINGS["tpe"]
    assert isinstance(strategy_for(settings, open_study(settings), TARGET, {}, []), SamplerSearch)


def test_local_search_queues_untried_neighbours_of_the_best_first() -> None:
    settings = SETTINGS["tpe+local"]
    study = open_study(settings)
    measured = VALID[20:26]
    known: dict[str, float | None] = {c.digest: cost(c) for c in measured}
    strategy = strategy_for(settings, study, TARGET, known)
    assert isinstance(strategy, LocalSearch)
    expected = neighbours(SPACE, TARGET, FIXED, known)[:3]
    assert len(expected) == 3
    made = run(strategy, 6, batch=6)
    assert [p.config for p in made[:3]] == expected  # half the batch
    assert all(any(one_step(p.config, m) for m in measured) for p in made[:3])
    assert all(SPACE.is_valid(p.config, TARGET) and p.config.digest not in known for p in made[:3])


def test_local_search_learns_from_what_it_is_told() -> None:
    """After a measurement beats everything known, the next batch refines around it."""
    settings = SETTINGS["tpe+local"]
    study = open_study(settings)
    known: dict[str, float | None] = {VALID[20].digest: cost(VALID[20])}
    strategy = strategy_for(settings, study, TARGET, known)
    strategy.begin_batch(2)
    proposal = strategy.propose()
    assert proposal is not None
    strategy.tell(proposal, Outcome(Status.OK, 1.0))  # far faster than anything known
    known[proposal.config.digest] = 1.0
    expected = neighbours(SPACE, TARGET, FIXED, known)[0]
    strategy.begin_batch(2)
    nxt = strategy.propose()
    assert nxt is not None and nxt.config == expected
    assert one_step(nxt.config, proposal.config)


def one_step(a: Config, b: Config) -> bool:
    return sum(x != y for x, y in zip(a.values, b.values, strict=True)) == 1


@pytest.mark.parametrize("name", ["tpe", "random"])
def test_the_samplers_record_every_proposal(name: str, tmp_path: Path) -> None:
    """Same seed, same proposals; the study holds one trial per proposal, told as it ended."""
    settings = SETTINGS[name]
    first, second = (
        run(strategy_for(settings, open_study(settings), TARGET, {}), 12) for _ in range(2)
    )
    assert [p.config for p in first] == [p.config for p in second]
    url = f"sqlite:///{tmp_path}/s.db"
    made = run(strategy_for(settings, open_study(settings, url=url), TARGET, {}), 12)
    trials = optuna.load_study(study_name="s", storage=url).trials
    assert [t.user_attrs["digest"] for t in trials] == [p.config.digest for p in made]
    assert all(t.state != optuna.trial.TrialState.RUNNING for t in trials)
    pruned = [t for t in trials if t.state == optuna.trial.TrialState.PRUNED]
    assert all(t.user_attrs["status"] == "invalid" and t.user_attrs["reason"] for t in pruned)


OUTCOMES: dict[str, tuple[Outcome, optuna.trial.TrialState, float | None, str | None]] = {
    "timed": (Outcome(Status.OK, 12.5), optuna.trial.TrialState.COMPLETE, 12.5, None),
    "failed": (
        Outcome(Status.CRASHED, reason="exit -11"),
        optuna.trial.TrialState.FAIL,
        None,
        "exit -11",
    ),
    "pruned": (
        Outcome(Status.INVALID, reason="smem", pruned=True),
        optuna.trial.TrialState.PRUNED,
        None,
        "smem",
    ),
    "repeat of a value": (
        Outcome(Status.REPEAT, 3.0),
        optuna.trial.TrialState.COMPLETE,
        3.0,
        None,
    ),
    "interrupted": (
        Outcome(Status.INTERRUPTED, reason="the session stopped: KeyboardInterrupt"),
        optuna.trial.TrialState.FAIL,
        None,
        "the session stopped: KeyboardInterrupt",
    ),
}


@pytest.mark.parametrize("case", list(OUTCOMES))
def test_an_outcome_becomes_the_trial_state_and_attributes(case: str, tmp_path: Path) -> None:
    outcome, state, value, reason = OUTCOMES[case]
    url = f"sqlite:///{tmp_path}/s.db"
    study = open_study(SETTINGS["random"], url=url)
    proposal = study.ask()
    study.tell(proposal, outcome)
    (trial,) = optuna.load_study(study_name="s", storage=url).trials
    assert trial.state == state and trial.value == value
    assert trial.user_attrs["status"] == outcome.status.value
    assert trial.user_attrs.get("reason") == reason
    assert trial.user_attrs["digest"] == proposal.config.digest
    assert Config.from_json(trial.user_attrs["config"]) == proposal.config


@pytest.mark.parametrize(
    ("outcome", "measured"),
    [
        (Outcome(Status.OK, 1.0), True),
        (Outcome(Status.REUSED, 1.0), True),
        (Outcome(Status.COMPILE_ERROR, reason="ptxas"), True),
        (Outcome(Status.INVALID, reason="not recorded"), True),  # evaluated, and refused
        (Outcome(Status.INVALID, reason="smem", pruned=True), False),
        (Outcome(Status.REPEAT, 1.0), False),
        (Outcome(Status.INFRASTRUCTURE), False),
        (Outcome(Status.INTERRUPTED), False),
    ],
)
def test_what_an_outcome_says_of_the_config(outcome: Outcome, measured: bool) -> None:
    assert outcome.measured is measured


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(("." * node.level) + node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_strategies_never_compile_time_or_store() -> None:
    path = Path(__file__).resolve().parents[2] / "autotune" / "tune" / "strategies.py"
    imported = _imports(path)
    assert imported, "no import found (the test reads the wrong file)"
    forbidden: list[Callable[[str], bool]] = [
        lambda m: ".build" in m or ".measure" in m or ".store" in m or ".launch" in m,
        lambda m: m.endswith(("backends", "loop")) or m.startswith(("torch", "sqlalchemy")),
    ]
    assert not [m for m in imported if any(rule(m) for rule in forbidden)], imported


def test_space_and_target_of_the_suite() -> None:
    """The suite's space has invalid points (else pruning is never exercised) and a default."""
    assert isinstance(SPACE, Space) and isinstance(TARGET, Target)
    assert 10 < len(VALID) < len(list(SPACE.all_configs(FIXED)))
    assert SPACE.heuristic(FIXED) in VALID
