"""`cute-autotune model fit | predict`: the performance model of the kernel families and torch
SDPA on a GPU model, fitted over a tuning database's measurements (autotune/tune/fit_model.py),
written as a JSON document that predicts without any fitting library (model/perf_model.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .._jsonfile import loads_json, read_json
from .._paths import shipped_model_files
from .._shown import for_terminal
from ..model.config import Config
from ..model.perf_model import PerfModel
from ..model.space import load_space
from ..store.perf_models import PerfModels
from ..store.repo import TuningStore
from ..store.schema import describe
from .args import HelpFormatter, add_database, positive_int
from .table import render_table


def cmd_fit(args: argparse.Namespace) -> int:
    from ..tune.fit_model import fit, held_out, timings_of, timings_of_recording

    if not args.out and not args.store:
        print(
            "model fit writes the model somewhere: --out FILE, --store (into the database), "
            "or both"
        )
        return 2

    try:
        import sklearn  # noqa: F401
    except ImportError:
        print("cute-autotune model fit needs scikit-learn: pip install scikit-learn")
        return 2
    data = []
    devices: set[str] = set()
    sources = []
    if args.db is not None or not args.recording:
        store = TuningStore(args.db, create=args.store)  # --store makes it where it is new
        rows = store.trials()  # read once: the timings and the GPU models they are of
        data += timings_of(rows, args.device)
        devices |= {row["device"] for row in rows} if args.device is None else {args.device}
        sources.append(describe(store.url))
    for path in args.recording or []:
        recording = read_json(Path(path))
        name = str(recording["device"]["name"])
        if args.device in (None, name):
            data += timings_of_recording(recording)
            devices.add(name)
        sources.append(path)
    if len(devices) > 1:
        raise ValueError(
            f"{', '.join(sources)} hold measurements of {sorted(devices)}: "
            "--device names the GPU model to fit"
        )
    if not data:
        print(f"no successful measurement in {', '.join(sources)}: nothing to fit")
        return 1
    device = next(iter(devices))
    print(
        f"{len(data)} timings of {len({t.problem for t in data})} problems on "
        f"{for_terminal(device)} in {', '.join(sources)}"
    )
    fit_args = {"trees": args.trees, "depth": args.depth}
    if args.folds > 1:
        errors = held_out(data, device, folds=args.folds, **fit_args)
        print(
            render_table(
                ["family", "timings", "problems", "median error", "p90 error", "in p20-p80"],
                [
                    [
                        e.family,
                        str(e.timings),
                        str(e.problems),
                        f"{e.median_error:.1%}",
                        f"{e.p90_error:.1%}",
                        f"{e.covered:.0%}",
                    ]
                    for e in errors
                ],
            )
        )
        print(f"(each problem predicted by a model fitted without it: {args.folds} folds)")
    doc = fit(data, device, **fit_args)
    if args.out:
        Path(args.out).write_text(json.dumps(doc, separators=(",", ":")) + "\n")
        print(
            f"{args.out}: the model of {len(data)} timings (data digest {doc['data_digest'][:12]})"
        )
    if args.store:
        target = TuningStore(args.db)
        PerfModels(target).save(doc, "model fit")
        print(
            f"kept in {describe(target.url)} as the model of {for_terminal(device)} "
            f"({len(data)} timings, data digest {doc['data_digest'][:12]})"
        )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from ..model.perf_model import shipped_perf_model

    store = TuningStore(args.db, create=False)
    stored = PerfModels(store).all()
    rows = [
        [
            for_terminal(m.device_name),
            f"fitted in {describe(store.url)} by {m.fitted_by}",
            str(m.timings),
            m.fitted_at.isoformat(timespec="seconds") if m.fitted_at else "?",
            m.data_digest[:12],
        ]
        for m in stored
    ]
    for path in shipped_model_files():
        shipped = read_json(path)
        model = shipped_perf_model(str(shipped.get("device")))
        if model is not None:
            rows.append(
                [
                    for_terminal(model.device),
                    f"shipped ({path.name})",
                    str(model.doc.get("timings", "?")),
                    str(model.doc.get("fitted_at")),
                    model.data_digest[:12],
                ]
            )
    if not rows:
        print("no performance model: none ships for a GPU and the database holds none")
        return 0
    print(render_table(["GPU model", "model", "timings", "fitted at", "data digest"], rows))
    print(
        "(explain() and tune --quick use a GPU's model fitted in the database where it learnt "
        "from at least as many timings as the shipped one)"
    )
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from .tuning import problem_from_args

    model = PerfModel(read_json(args.model))
    problem = problem_from_args(args)
    data: Any = loads_json(args.config, "--config")
    if not isinstance(data, dict) or "family" not in data:
        raise ValueError(
            "--config is a JSON object with its family, e.g. "
            '{"family": "sm90", "block_m": 128, ...}'
        )
    family = data.pop("family")
    config = load_space(family).validate(Config.make(family, {**data, **problem.space_values()}))
    print(
        f"{problem.describe()}, {load_space(family).name_of(config)} on "
        f"{for_terminal(model.device)}: {model.predict(problem, config).describe()}"
    )
    return 0


def register(sub: Any) -> None:
    from .tuning import add_problem_args

    p = sub.add_parser(
        "model",
        help="the performance model: fit it over a database's "
        "measurements, predict a config's time",
    )
    actions = p.add_subparsers(dest="model_command", required=True, help="what to do")
    p = actions.add_parser(
        "fit",
        formatter_class=HelpFormatter,
        help="fit the model over the measurements of one GPU model (scikit-learn), report its "
        "error on problems left out of the fit, write it as JSON",
    )
    add_database(p)
    p.add_argument(
        "--recording",
        action="append",
        help="a recording of benchmarks/sweep.py (every config of a family timed on "
        "a few problems) to fit on too (repeatable; without --db, these alone)",
    )
    p.add_argument(
        "--device",
        help="the GPU model's name, e.g. 'NVIDIA H200' (needed when the database holds several)",
    )
    p.add_argument("--out", help="write the model's JSON document here")
    p.add_argument(
        "--store",
        action="store_true",
        help="keep the model in the database (--db) as its GPU model's model, "
        "which explain() and tune --quick then use (tune and import refit it "
        "there on their own)",
    )
    p.add_argument(
        "--folds",
        type=int,
        default=5,
        help="folds of the held-out error by problem (0 or 1: none)",
    )
    p.add_argument("--trees", type=positive_int, default=200, help="trees per quantile")
    p.add_argument("--depth", type=positive_int, default=4, help="depth of each tree")
    p.set_defaults(func=cmd_fit)
    p = actions.add_parser(
        "list",
        formatter_class=HelpFormatter,
        help="the models a database holds and the ones shipped in db/",
    )
    add_database(p)
    p.set_defaults(func=cmd_list)
    p = actions.add_parser(
        "predict",
        formatter_class=HelpFormatter,
        help="a config's predicted time on a problem, with its p20-p80 range",
    )
    p.add_argument("--model", required=True, help="a model file `model fit` wrote")
    p.add_argument(
        "--config",
        required=True,
        help='the config as JSON, e.g. \'{"family": "sm90", "block_m": 128, ...}\' '
        "(its head dim, dtype and causality are the problem's)",
    )
    add_problem_args(p, required=True)
    p.set_defaults(func=cmd_predict)
