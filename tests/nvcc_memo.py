"""nvcc for the test run, remembering its builds (tests/conftest.py puts it first): a build the
run made before, the same command on the same source and kernel headers, is answered from the
memo (the cubin, ptxas's report, the exit status) instead of compiling again. The tests that
build the same small config in several places then pay nvcc once. Anything but a build (such
as --version) goes to the real nvcc.

    python nvcc_memo.py REAL_NVCC MEMO_DIR ARGS...
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path


def _key(args: list[str]) -> str | None:
    """The digest of a build: its flags, its source's text and the kernel headers it includes
    (the -I folders other than the toolkit's and CUTLASS's, which do not change during a run);
    None for a command that is not a build of one source into -o."""
    if "-o" not in args or not args[-1].endswith(".cu"):
        return None
    out = args.index("-o")
    digest = hashlib.sha256()
    for arg in args[:out] + args[out + 2 : -1]:
        digest.update(arg.encode() + b"\0")
        if arg.startswith("-I") and (Path(arg[2:]) / "fwd_params.h").is_file():
            root = Path(arg[2:])
            for path in sorted(p for p in root.rglob("*") if p.is_file()):
                digest.update(path.relative_to(root).as_posix().encode() + b"\0")
                digest.update(path.read_bytes() + b"\0")
    digest.update(Path(args[-1]).read_bytes())
    return digest.hexdigest()


def main(real: str, memo: Path, args: list[str]) -> int:
    key = _key(args)
    if key is None:
        return subprocess.run([real, *args]).returncode
    entry = memo / key
    output = Path(args[args.index("-o") + 1])
    if (entry / "result.json").is_file():
        result = json.loads((entry / "result.json").read_text())
        if result["returncode"] == 0:
            output.write_bytes((entry / "output").read_bytes())
    else:
        done = subprocess.run([real, *args], capture_output=True, text=True)
        result = {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
        staging = memo / f".{key}.{os.getpid()}"
        staging.mkdir(parents=True, exist_ok=True)
        if done.returncode == 0:
            (staging / "output").write_bytes(output.read_bytes())
        (staging / "result.json").write_text(json.dumps(result))
        try:
            staging.rename(entry)  # atomic; another process's equal build may have won
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    sys.stdout.write(result["stdout"])
    sys.stderr.write(result["stderr"])
    return int(result["returncode"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3:]))
