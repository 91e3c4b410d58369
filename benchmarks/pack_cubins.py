"""Pack cached cubins into a gzipped tarball that a GPU-host call carries and unpacks into its
kernel cache (cubins compress about 3.7x, and a device call carries at most 64 MiB).

    python benchmarks/pack_cubins.py --cache .cubins --db sqlite:///.tuning/h200.db out.tgz
        # the cubins of every best config in a tuning database (e.g. the sm80 bests that
        # defend their place while sm90 is tuned)
    python benchmarks/pack_cubins.py --cache .cubins90 --family sm90 [--head-dim 64] out.tgz
        # every cached cubin of a family (of some head dims), built with the current sources
        # and toolchain
    python benchmarks/pack_cubins.py --cache .cubins --configs configs.json out.tgz
        # the cubins of a JSON list of configs

Members are `cubins/<family>/<key>/...`: unpack with `tar xzf out.tgz -C $CUTE_AUTOTUNE_CACHE`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path

from autotune.build import ArtifactCache, lookup
from autotune.model import Config, target_for_arch
from autotune.store import TuningStore


def config_dirs(
    cache: ArtifactCache, configs: list[Config], arch: int
) -> tuple[list[Path], list[str]]:
    target = target_for_arch(arch)
    found, missing = [], []
    for config in configs:
        build = lookup(config, target, cache)
        if build is None or build.cubin is None:
            missing.append(config.to_json())
        else:
            found.append(build.cubin.parent)
    return sorted(set(found)), missing


def family_dirs(
    cache: ArtifactCache, family: str, arch: int, head_dims: list[int] | None = None
) -> list[Path]:
    """Entries of the family that the current sources and toolchain would build (the key of
    an older build no longer matches, so it stays behind), optionally of some head dims."""
    target = target_for_arch(arch)
    dirs = []
    for directory in sorted((cache.root / family).glob("*")):
        try:
            config = Config.from_json(
                json.dumps(json.loads((directory / "build.json").read_text())["config"])
            )
        except (OSError, ValueError, KeyError):
            continue
        if head_dims and config["head_dim"] not in head_dims:
            continue
        build = lookup(config, target, cache)
        if build is not None and build.cubin is not None and build.cubin.parent == directory:
            dirs.append(directory)
    return dirs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--cache", type=Path, required=True, help="the kernel cache directory")
    ap.add_argument("--db", help="pack the cubins of this database's best configs")
    ap.add_argument("--family", help="pack every current cubin of this family")
    ap.add_argument(
        "--configs", type=Path, help="pack the cubins of the configs in this JSON list"
    )
    ap.add_argument("--head-dim", type=int, nargs="+", help="with --family: only these head dims")
    ap.add_argument("--arch", type=int, default=90, help="compute capability of the GPU host")
    args = ap.parse_args()
    cache = ArtifactCache(args.cache)
    if sum(map(bool, (args.db, args.family, args.configs))) != 1:
        ap.error("give one of --db, --family and --configs")
    missing: list[str] = []
    if args.db:
        configs = [r.config for r in TuningStore(args.db).list_best()]
        dirs, missing = config_dirs(cache, configs, args.arch)
    elif args.configs:
        configs = [Config.from_json(json.dumps(c)) for c in json.loads(args.configs.read_text())]
        dirs, missing = config_dirs(cache, configs, args.arch)
    else:
        dirs = family_dirs(cache, args.family, args.arch, args.head_dim)
    with tarfile.open(args.out, "w:gz") as tar:
        for directory in dirs:
            tar.add(directory, arcname=str(directory.relative_to(args.cache)))
    print(
        f"{args.out}: {len(dirs)} cubins, {args.out.stat().st_size / 2**20:.1f} MiB"
        + (f"; {len(missing)} best configs have no cubin in {args.cache}" if missing else "")
    )
    for config in missing:
        print(f"  missing: {config}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
