"""The package's stages import only earlier stages (autotune/__init__.py names the order), and
the runtime path stays free of the tuner. Every import counts, also the ones inside functions."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "autotune"
# Helpers every stage may use: paths, atomic JSON files, process identity, lazy names, values
# shown in messages, bounded memos.
BASE = {
    "_paths",
    "_jsonfile",
    "_process",
    "_lazy",
    "_version",
    "_shown",
    "_bounded",
    "__main__",
}  # `python -m autotune`, the command line's entry
STAGES = ["model", "build", "launch", "measure", "store", "runtime", "tune", "cli"]
# The runtime serves attention() in users' processes: from the measure stage it takes torch
# SDPA (its baseline and fallback) and nothing else.
RUNTIME_MAY_USE = {"measure": {"measure.sdpa"}}
# Import cycles, with the ones that are by design: attention and kvcache register their custom
# ops on import, and each op's body calls its module's eager path (a function-level import).
CYCLE_EDGES_ALLOWED = {
    ("runtime.op", "runtime.attention"),
    ("runtime.op", "runtime.kvcache"),
    ("runtime.training", "runtime.attention"),
}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Module names inside the package that `path` imports, relative to the package."""
    here = _name(path).split(".") if _name(path) else []
    package = here if path.name == "__init__.py" else here[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = [*base, *(node.module.split(".") if node.module else [])]
            elif node.module and node.module.split(".")[0] == "autotune":
                target = node.module.split(".")[1:]
            else:
                continue
            if node.module is None or not target:  # `from . import x`: x is the module
                found.update(".".join([*target, a.name]) for a in node.names)
            else:
                found.add(".".join(target))
        elif isinstance(node, ast.Import):
            found.update(
                ".".join(a.name.split(".")[1:])
                for a in node.names
                if a.name.split(".")[0] == "autotune"
            )
    return {f for f in found if f}


def _stage(module: str) -> str | None:
    head = module.split(".")[0]
    return head if head in STAGES else None


CASES = [p for p in _modules() if _stage(_name(p))]
NAMES = {_name(p) for p in _modules()}


@pytest.mark.parametrize("path", CASES, ids=lambda p: _name(p))
def test_a_stage_imports_only_earlier_stages(path: Path) -> None:
    module = _name(path)
    stage = _stage(module)
    assert stage is not None
    allowed = set(STAGES[: STAGES.index(stage) + 1])
    wrong = []
    for target in sorted(_imports(path)):
        other = _stage(target)
        if other is None:
            assert target.split(".")[0] in BASE, f"{module} imports unknown {target}"
            continue
        if other not in allowed:
            wrong.append(target)
        elif (
            stage == "runtime"
            and other in RUNTIME_MAY_USE
            and not any(target == m or target.startswith(m + ".") for m in RUNTIME_MAY_USE[other])
        ):
            wrong.append(target)
    assert not wrong, f"{module} ({stage}) imports later or forbidden stages: {wrong}"


def test_no_import_cycles() -> None:
    graph = {
        _name(p): {
            t for t in _imports(p) if t in NAMES and (_name(p), t) not in CYCLE_EDGES_ALLOWED
        }
        for p in _modules()
        if _name(p)
    }
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            assert state.get(nxt) != 1, f"import cycle: {' -> '.join([*path, node, nxt])}"
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_every_module_belongs_to_a_stage() -> None:
    loose = [
        _name(p) for p in _modules() if _name(p) and not _stage(_name(p)) and _name(p) not in BASE
    ]
    assert not loose, f"modules outside the stage packages: {loose}"


def test_stage_packages_say_what_they_do() -> None:
    for stage in STAGES:
        doc = ast.get_docstring(ast.parse((PACKAGE / stage / "__init__.py").read_text()))
        assert doc and len(doc) > 40, f"autotune/{stage}/__init__.py needs a docstring"


def test_attention_loads_neither_the_tuner_nor_the_worker() -> None:
    probe = (
        "import sys, autotune\n"
        "loaded = set(sys.modules)\n"
        "assert not any(m.startswith(('autotune.build', 'autotune.store', 'autotune.tune',"
        " 'autotune.measure', 'autotune.runtime', 'autotune.cli')) for m in loaded), loaded\n"
        "assert 'torch' not in loaded and 'optuna' not in loaded and 'sqlalchemy' not in loaded\n"
        "autotune.attention\n"
        "bad = [m for m in sys.modules if m.startswith(('autotune.tune', 'autotune.cli',"
        " 'autotune.measure.worker', 'autotune.measure.timing', 'autotune.measure.gpu_tasks',"
        " 'autotune.measure.validate', 'optuna'))]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
