"""Scripts use public entry points only (issue 14): every `from autotune...` import in
benchmarks/*.py names `autotune` or a stage package (`autotune.<stage>`), never one of its
modules, and only names the package lists in `__all__`. Each stage's `__all__` resolves lazily,
so importing one stage module still loads none of the others."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["model", "build", "launch", "measure", "store", "runtime", "tune", "cli"]
PUBLIC_PACKAGES = {"autotune", *(f"autotune.{stage}" for stage in STAGES)}
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def _all(package: str) -> list[str]:
    names = getattr(importlib.import_module(package), "__all__", None)
    assert isinstance(names, list), f"{package} has no __all__"
    return names


def _autotune_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import of the package in `path`, in functions too."""
    found: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and (node.module == "autotune" or node.module.startswith("autotune."))
        ):
            found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found.extend(
                (node.lineno, a.name, [])
                for a in node.names
                if a.name == "autotune" or a.name.startswith("autotune.")
            )
    return found


def test_scripts_found() -> None:
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_scripts_import_public_names_only(path: Path) -> None:
    problems = []
    for line, module, names in _autotune_imports(path):
        where = f"{path.name}:{line}"
        if module not in PUBLIC_PACKAGES:
            problems.append(f"{where}: imports {module} (use autotune or autotune.<stage>)")
            continue
        public = set(_all(module))
        for name in names:
            if name.startswith("_"):
                problems.append(f"{where}: private name {module}.{name}")
            elif name not in public:
                problems.append(f"{where}: {module}.{name} is not in {module}.__all__")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("stage", STAGES)
def test_stage_all_resolves(stage: str) -> None:
    package = importlib.import_module(f"autotune.{stage}")
    names = _all(f"autotune.{stage}")
    assert len(names) == len(set(names)), "duplicate names in __all__"
    for name in names:
        assert not name.startswith("_")
        value = getattr(package, name)
        # A name that is also a submodule's would resolve to the module once it is imported.
        assert not isinstance(value, types.ModuleType), f"autotune.{stage}.{name} is a module"
    with pytest.raises(AttributeError):
        package.no_such_name  # noqa: B018


def test_stage_packages_stay_lazy() -> None:
    """Importing the runtime's attention (which imports measure.sdpa) does not load the rest of
    the measure stage through measure/__init__.py, nor the tuner."""
    code = (
        "import sys, autotune.runtime.attention\n"
        "bad = [m for m in ('autotune.measure.timing', 'autotune.measure.worker', "
        "'autotune.tune', 'optuna') if m in sys.modules]\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_lazy_name_follows_its_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """A public name is read from its loaded module on every lookup, never kept on the package:
    a replacement on the module (a test's monkeypatch, a user's wrapper) is what the package
    name gives."""
    import autotune
    import autotune.runtime.attention as module

    assert autotune.attention is module.attention

    def replacement(*args: object, **kwargs: object) -> None:
        return None

    monkeypatch.setattr(module, "attention", replacement)
    assert autotune.attention is replacement
    assert "attention" not in vars(autotune)
