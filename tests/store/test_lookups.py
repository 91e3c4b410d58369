"""The store's lookups (best, nearest, family_tuned, families_faster_than_sdpa) filter in SQL:
they must answer exactly what a scan of every row in Python answers, ties and order included;
the indexes behind them exist after an upgrade; the schema is checked once per store."""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import sqlalchemy as sa

from autotune.model.config import Config
from autotune.model.problem import Problem
from autotune.model.space import load_space
from autotune.model.status import Status
from autotune.model.target import target_for_arch
from autotune.store import schema
from autotune.store.records import DeviceInfo, TrialResult
from autotune.store.repo import TuningStore, problem_distance
from autotune.store.schema import make_engine, upgrade

DATA = Path(__file__).resolve().parent.parent / "data"

H200 = DeviceInfo("NVIDIA H200", 90, 132, "580.159.04", "13.0")
H200_OTHER_DRIVER = DeviceInfo("NVIDIA H200", 90, 132, "590.1", "13.1")
H100 = DeviceInfo("NVIDIA H100 80GB HBM3", 90, 132, "580.1", "13.0")
A100 = DeviceInfo("NVIDIA A100-SXM4-80GB", 80, 108, "580.1", "13.0")
DEVICES = (H200, H200_OTHER_DRIVER, H100, A100)
# Few distinct sizes, so that many stored problems lie at the same distance from a question.
SEQLENS = (1, 16, 128, 1024, 2048, 4096)
STUDIES = ("s1", "s2")


def bucket(seqlen_q: int) -> str:
    return "decode" if seqlen_q <= 16 else "prefill"


def random_problem(rng: random.Random) -> Problem:
    heads_kv = rng.choice((2, 4))
    return Problem(
        rng.choice((1, 2, 4)),
        heads_kv * rng.choice((1, 2)),
        heads_kv,
        rng.choice(SEQLENS),
        rng.choice(SEQLENS),
        rng.choice((64, 128)),
        rng.choice(("fp16", "bf16")),
        rng.random() < 0.5,
    )


@cache
def first_configs(
    family: str, capability: int, head_dim: int, dtype: str, causal: bool
) -> tuple[Config, ...]:
    valid = load_space(family).valid_configs(
        target_for_arch(capability), {"head_dim": head_dim, "dtype": dtype, "causal": causal}
    )
    return tuple(valid[:3])


def random_config(rng: random.Random, device: DeviceInfo, problem: Problem) -> Config:
    families = ["sm80", "sdpa"] + (["sm90"] if device.compute_capability == 90 else [])
    return rng.choice(
        first_configs(
            rng.choice(families),
            device.compute_capability,
            problem.head_dim,
            problem.dtype,
            problem.causal,
        )
    )


def fill(store: TuningStore, rng: random.Random, bests: int) -> list[Problem]:
    """Best rows of many GPUs, problems and families (some of one GPU model under two drivers),
    each beside a few measurements of random studies, phases, statuses and SDPA timings."""
    problems = [random_problem(rng) for _ in range(bests // 2)]
    for _ in range(bests):
        device, problem = rng.choice(DEVICES), rng.choice(problems)
        config = random_config(rng, device, problem)
        us = float(rng.choice((50, 100, 200, 400)))
        sdpa = rng.choice((None, us * 0.8, us, us * 1.5))
        measurement_id = None
        for _ in range(rng.randrange(3)):
            status = rng.choice((Status.OK, Status.OK, Status.CRASHED))
            result = TrialResult(
                random_config(rng, device, problem),
                status,
                median_us=us * rng.choice((0.5, 1.0, 2.0)) if status == Status.OK else None,
            )
            measurement_id = store.record_trial(
                device,
                problem,
                result,
                build=None,
                study=rng.choice(STUDIES),
                phase=rng.choice(("search", "rerank")),
                baseline_us=rng.choice((None, us)),
            )
        store.set_best(
            device,
            problem,
            TrialResult(config, Status.OK, median_us=us),
            measurement_id=rng.choice((measurement_id, None)),
            study=rng.choice(STUDIES),
            trials=3,
            sdpa_default_us=sdpa,
            sdpa_flash_us=None,
        )
    return problems


# -- the brute-force answers: every row read back, filtered and ranked in Python ---------------


@dataclass(frozen=True)
class Row:
    id: int
    device: DeviceInfo
    problem_id: int
    problem: Problem
    family: str  # of the best row
    config_family: str  # of its config
    speedup: float | None
    measurement_id: int | None


@dataclass(frozen=True)
class Trial:
    id: int
    device: DeviceInfo
    problem_id: int
    problem: Problem
    family: str
    study: str
    phase: str
    status: str
    median_us: float | None
    baseline_us: float | None


def _device(row: sa.Row[tuple[object, ...]]) -> DeviceInfo:
    return DeviceInfo(
        row.name, row.compute_capability, row.sm_count, row.driver_version, row.cuda_version
    )


def _problem(row: sa.Row[tuple[object, ...]]) -> Problem:
    return Problem(
        row.batch,
        row.heads_q,
        row.heads_kv,
        row.seqlen_q,
        row.seqlen_k,
        row.head_dim,
        row.dtype,
        bool(row.causal),
    )


def scan(store: TuningStore) -> tuple[list[Row], list[Trial]]:
    columns = (
        "d.name, d.compute_capability, d.sm_count, d.driver_version, d.cuda_version, "
        "p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim, p.dtype, "
        "p.causal, k.family AS config_family"
    )
    with store.engine.connect() as c:
        bests = c.exec_driver_sql(
            f"SELECT b.id, b.problem_id, b.family, b.speedup_vs_default, b.measurement_id, "
            f"{columns} FROM best_configs b JOIN devices d ON d.id = b.device_id "
            "JOIN problems p ON p.id = b.problem_id JOIN kernel_configs k ON k.id = b.config_id "
            "ORDER BY b.id"
        ).all()
        trials = c.exec_driver_sql(
            f"SELECT m.id, m.problem_id, m.study, m.phase, m.status, m.median_us, "
            f"m.baseline_us, {columns} FROM measurements m "
            "JOIN devices d ON d.id = m.device_id JOIN problems p ON p.id = m.problem_id "
            "JOIN kernel_configs k ON k.id = m.config_id ORDER BY m.id"
        ).all()
    return (
        [
            Row(
                r.id,
                _device(r),
                r.problem_id,
                _problem(r),
                r.family,
                r.config_family,
                r.speedup_vs_default,
                r.measurement_id,
            )
            for r in bests
        ],
        [
            Trial(
                t.id,
                _device(t),
                t.problem_id,
                _problem(t),
                t.config_family,
                t.study,
                t.phase,
                t.status,
                t.median_us,
                t.baseline_us,
            )
            for t in trials
        ],
    )


def same_model(a: DeviceInfo, b: DeviceInfo) -> bool:
    return (a.name, a.compute_capability, a.sm_count) == (b.name, b.compute_capability, b.sm_count)


def on(device: DeviceInfo | str | None, row: Row) -> bool:
    if device is None:
        return True
    if isinstance(device, str):
        return row.device.name == device
    return same_model(row.device, device)


def scan_best(rows: list[Row], device: DeviceInfo | str | None, problem: Problem) -> Row | None:
    return next((r for r in rows if on(device, r) and r.problem == problem), None)


def scan_nearest(
    rows: list[Row], device: DeviceInfo | str | None, problem: Problem, family: str | None
) -> tuple[Row, float] | None:
    candidates = [
        (problem_distance(problem, r.problem), r.id, r)
        for r in rows
        if on(device, r)
        and (family is None or r.config_family == family)
        and (r.problem.dtype, r.problem.head_dim, r.problem.causal)
        == (problem.dtype, problem.head_dim, problem.causal)
    ]
    if not candidates:
        return None
    distance, _, row = min(candidates, key=lambda c: (c[0], c[1]))
    return row, distance


def scan_family_tuned(
    rows: list[Row], trials: list[Trial], device: DeviceInfo, problem: Problem, study: str
) -> bool:
    best = scan_best(rows, device, problem)
    if best is None or best.measurement_id is None:
        return False
    mine = [
        t.id
        for t in trials
        if t.study == study and t.problem_id == best.problem_id and t.device.name == device.name
    ]
    search = [
        t.id
        for t in trials
        if t.study == study
        and t.problem_id == best.problem_id
        and t.device.name == device.name
        and t.phase == "search"
    ]
    return bool(mine) and (not search or best.measurement_id > max(search))


def scan_faster(
    rows: list[Row], trials: list[Trial], device: DeviceInfo, region: tuple[int, str, bool, str]
) -> set[str]:
    def inside(p: Problem) -> bool:
        return (p.head_dim, p.dtype, p.causal, bucket(p.seqlen_q)) == region

    found = {
        r.family
        for r in rows
        if same_model(r.device, device)
        and inside(r.problem)
        and r.family != "sdpa"
        and (r.speedup or 0) > 1.0
    }
    return found | {
        t.family
        for t in trials
        if same_model(t.device, device)
        and inside(t.problem)
        and t.status == "ok"
        and t.family != "sdpa"
        and t.median_us is not None
        and t.baseline_us is not None
        and t.median_us < t.baseline_us
    }


def key(record_device: DeviceInfo, record_problem: Problem) -> tuple[DeviceInfo, Problem]:
    """A best row is one per (device, problem): what names it in a record."""
    return record_device, record_problem


# -- the suite, on SQLite and on PostgreSQL ---------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/t.db"
    else:
        yield request.getfixturevalue("postgres_url")


@pytest.mark.parametrize("seed", [0, 1])
def test_lookups_answer_what_a_scan_of_every_row_answers(url: str, seed: int) -> None:
    rng = random.Random(seed)
    store = TuningStore(url)
    stored = fill(store, rng, bests=120)
    rows, trials = scan(store)
    assert len(rows) > 60 and len(trials) > 60
    asked = rng.sample(stored, 30) + [random_problem(rng) for _ in range(20)]
    wheres: list[DeviceInfo | str | None] = [*DEVICES, None, H200.name, "NVIDIA B200"]
    ties = 0
    for problem in asked:
        for device in wheres:
            want = scan_best(rows, device, problem)
            got = store.best(device, problem)
            assert (None if got is None else key(got.device, got.problem)) == (
                None if want is None else key(want.device, want.problem)
            ), (device, problem)
            for family in (None, "sm80", "sm90", "sdpa"):
                near = scan_nearest(rows, device, problem, family)
                found = store.nearest(device, problem, family=family)
                if near is None:
                    assert found is None, (device, problem, family)
                    continue
                assert found is not None, (device, problem, family)
                assert key(found[0].device, found[0].problem) == key(
                    near[0].device, near[0].problem
                )
                assert found[1] == near[1]
                ties += sum(
                    1
                    for r in rows
                    if on(device, r)
                    and r.id != near[0].id
                    and r.problem.space_values() == problem.space_values()
                    and (family is None or r.config_family == family)
                    and problem_distance(problem, r.problem) == near[1]
                )
        for device in DEVICES:
            for study in STUDIES:
                assert store.family_tuned(device, problem, study) == scan_family_tuned(
                    rows, trials, device, problem, study
                ), (device, problem, study)
            region = (problem.head_dim, problem.dtype, problem.causal, bucket(problem.seqlen_q))
            assert store.families_faster_than_sdpa(device, region, bucket) == scan_faster(
                rows, trials, device, region
            ), (device, region)
    assert ties > 0, "the randomised store should hold ties in distance"


# -- indexes and the schema check --------------------------------------------------------------


LOOKUP_INDEXES = {
    (
        "problems",
        "ix_problems_class",
        (
            "dtype",
            "head_dim",
            "causal",
            "kv_cache",
            "backward",
            "deterministic",
            "seqlen_q",
            "seqlen_k",
            "batch",
            "heads_q",
            "heads_kv",
        ),
    ),
    ("best_configs", "ix_best_configs_problem", ("problem_id",)),
}


def indexes(engine: sa.Engine) -> set[tuple[str, str, tuple[str, ...]]]:
    inspector = sa.inspect(engine)
    return {
        (table, ix["name"], tuple(c for c in ix["column_names"] if c is not None))
        for table in ("problems", "best_configs")
        for ix in inspector.get_indexes(table)
        if ix["name"] is not None
    }


def test_the_lookup_indexes_exist_in_a_new_database(url: str) -> None:
    assert LOOKUP_INDEXES <= indexes(TuningStore(url).engine)


@pytest.mark.parametrize("release", ["0.1.0", "0.2.0"])
def test_the_lookup_indexes_exist_after_an_upgrade(tmp_path: Path, release: str) -> None:
    copy = tmp_path / f"tuning-{release}.db"
    shutil.copy(DATA / copy.name, copy)
    engine = make_engine(f"sqlite:///{copy}")
    assert not LOOKUP_INDEXES & indexes(engine)
    upgrade(engine)
    assert LOOKUP_INDEXES <= indexes(engine)
    store = TuningStore(f"sqlite:///{copy}")
    for record in store.list_best():  # and the lookups read the upgraded rows
        assert store.best(record.device, record.problem) is not None
        assert store.nearest(record.device, record.problem) is not None


def test_the_schema_is_checked_once_per_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opening checks the schema (and names the upgrade command when it is old); lookups on a
    dispatch miss and tune's per-trial writes do not check it again."""
    calls = {"check": 0, "revision": 0}
    check, revision = schema.check_schema, schema.current_revision

    def counted_check(*args: object, **kwargs: object) -> None:
        calls["check"] += 1
        check(*args, **kwargs)  # type: ignore[arg-type]

    def counted_revision(*args: object, **kwargs: object) -> str | None:
        calls["revision"] += 1
        return revision(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(schema, "check_schema", counted_check)
    monkeypatch.setattr(schema, "current_revision", counted_revision)
    store = TuningStore(f"sqlite:///{tmp_path}/t.db")
    # a new database: checked (the rest is read and made under the schema lock, store.migrate)
    assert calls == {"check": 1, "revision": 1}
    calls.update(check=0, revision=0)
    rng = random.Random(0)
    stored = fill(store, rng, bests=10)
    for problem in stored:
        store.best(H200, problem)
        store.nearest(H200, problem)
        store.family_tuned(H200, problem, "s1")
        store.families_faster_than_sdpa(
            H200,
            (problem.head_dim, problem.dtype, problem.causal, bucket(problem.seqlen_q)),
            bucket,
        )
    assert calls == {"check": 0, "revision": 0}
    TuningStore(engine=store.engine).best(H200, stored[0])  # an engine already checked
    assert calls == {"check": 0, "revision": 0}
    TuningStore(f"sqlite:///{tmp_path}/t.db", create=False).best(H200, stored[0])
    assert calls == {"check": 1, "revision": 1}  # another store opens: checked again, once


def test_an_engine_handed_to_the_store_is_checked_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/old.db"
    shutil.copy(DATA / "tuning-0.2.0.db", tmp_path / "old.db")
    engine = make_engine(url)
    with pytest.raises(schema.SchemaOutdated, match=r"cute-autotune db upgrade --db"):
        TuningStore(engine=engine)
    upgrade(engine)
    assert TuningStore(engine=engine).list_best()
