"""A non-editable install must carry kernel_src/ and search_spaces/ inside the package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from autotune.build.toolchain import family_source_hash
from autotune.model.space import load_space

REPO = Path(__file__).resolve().parent.parent


def test_wheel_installs_and_finds_its_data(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-q", "-w", str(wheels)],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("cute_autotune-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    # Every source file of every kernel family and every space and shape set, read from the
    # tree, so a new family folder cannot be left out of the wheel unnoticed.
    shipped = {
        "kernel_src": "autotune/kernel_src",
        "search_spaces": "autotune/search_spaces",
        "db": "autotune/db",
    }
    required = [
        f"{shipped[top]}/{path.relative_to(REPO / top).as_posix()}"
        for top in shipped
        for path in (REPO / top).rglob("*")
        if path.suffix in (".h", ".cuh", ".cpp", ".toml", ".json", ".py")
        and "__pycache__" not in path.parts
    ]
    assert "autotune/kernel_src/sm90/fwd_kernel.cuh" in required
    required += ["autotune/py.typed", "autotune/__main__.py"]  # typed; `python -m autotune`
    missing = [name for name in required if name not in names]
    assert not missing, f"not in the wheel: {missing}"
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    probe = (
        "import json, autotune, autotune._paths as p;"
        "from autotune.model.space import load_space;"
        "from autotune.build.toolchain import family_source_hash;"
        "from autotune.store.schema import open_engine, current_revision;"
        f"e = open_engine('sqlite:///{tmp_path}/probe.db');"
        "s = load_space('sm80'); print(json.dumps([autotune.__file__, "
        "str(p.kernel_src_dir()), family_source_hash(s), current_revision(e)]))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    ).stdout
    module, kernel_src, source_hash, revision = json.loads(out)
    assert revision == "0.7.0"  # the migrations ship with the package
    command = subprocess.run(
        [sys.executable, "-m", "autotune", "--help"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert command.returncode == 0 and "tune" in command.stdout
    assert module.startswith(str(site)) and kernel_src.startswith(str(site))
    # Same sources, same hash: an installed copy shares the artifact cache with a checkout.
    assert source_hash == family_source_hash(load_space("sm80"))
