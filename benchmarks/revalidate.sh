#!/usr/bin/env bash
# Re-validation of a kernel change on the GPU host (a structural change between kernel versions:
# the whole space waits for the next version). Run from the repository root by the device tool,
# wheels in .whl/, cubins prebuilt on this machine packed in .c90pack/*.tgz (optional). The
# kernel cache lives in .cubins/ on the host, so calls made while the host is still warm reuse it.
#
#   bash benchmarks/revalidate.sh sample sm90 [sm80]  # a seeded sample of FRACTION (0.25) of each
#                                      # family's valid configs covering every parameter value:
#                                      # compiled on all cores, validated (cute-autotune check)
#   bash benchmarks/revalidate.sh prebuild sm80        # compile only (background use)
#   bash benchmarks/revalidate.sh versions             # llm-prefill, old and new builds of the
#                                      # same configs side by side (benchmarks/kernel_versions.py;
#                                      # the old tree in .oldtree/)
#   bash benchmarks/revalidate.sh sanitize             # racecheck + synccheck on the structural
#                                      # variants (benchmarks/configs/structural_variants.json;
#                                      # VARIANTS=benchmarks/configs/decode_structural_variants.json
#                                      # for the decode family's, KV-cache paths included)
# Several stages in one call: bash benchmarks/revalidate.sh "sample sm80" versions sanitize
set -uo pipefail
if [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUTE_AUTOTUNE_CACHE=${CUTE_AUTOTUNE_CACHE:-$PWD/.cubins}
OUT=${OUT:-/tmp/out}; R=/tmp/revalidate; mkdir -p "$R" "$OUT"  # one tarball back (few files may)
FRACTION=${FRACTION:-0.25}; SEED=${SEED:-14}
mkdir -p "$CUTE_AUTOTUNE_CACHE"
. benchmarks/sanitize_variants.sh  # sanitize_variants LIST OUT [PARALLEL] [TIMEOUT]
for pack in .c90pack/*.tgz; do [ -e "$pack" ] && tar xzf "$pack" -C "$CUTE_AUTOTUNE_CACHE"; done

sample_file() {  # the seeded covering sample of one family, as a config list
  python3 -c "import json
from autotune.model.sampling import covering_sample
from autotune.model.space import load_space
from autotune.model.target import target_for_arch
space = load_space('$1'); configs = space.valid_configs(target_for_arch('sm_90'))
sample = covering_sample(configs, $FRACTION, seed=$SEED)
json.dump([c.as_dict() for c in sample], open('/tmp/sample_$1.json', 'w'))
print('$1:', len(sample), 'of', len(configs), 'valid configs')"
}

for stage in "$@"; do
  set -- $stage
  case "$1" in
  prebuild)
    sample_file "$2"
    python3 -m autotune.cli compile --config @/tmp/sample_$2.json --arch sm_90 --quiet \
      ${JOBS:+--jobs $JOBS} > "$R/compile_$2.txt" 2>&1; tail -n 2 "$R/compile_$2.txt" ;;
  pipeline)
    # Both families' samples in chunks: chunk i+1 compiles on all cores while chunk i is
    # validated (three check processes share the GPU; validation is host-bound). Stops starting
    # chunks after UNTIL seconds; chunks listed in SKIP (e.g. SKIP="000 001") were checked by an earlier call.
    shift; t0=$(date +%s)
    for family in "$@"; do sample_file "$family"; done
    python3 -c "import json, sys
configs = [c for f in sys.argv[1:] for c in json.load(open(f'/tmp/sample_{f}.json'))]
for i in range(0, len(configs), ${CHUNK:-60}):
    json.dump(configs[i:i + ${CHUNK:-60}], open(f'/tmp/chunk_{i // ${CHUNK:-60}:03d}.json', 'w'))
print(len(configs), 'configs')" "$@"
    for chunk in /tmp/chunk_*.json; do
      name=$(basename "$chunk" .json)
      case " ${SKIP:-} " in *" ${name#chunk_} "*) continue ;; esac
      [ $(( $(date +%s) - t0 )) -gt "${UNTIL:-480}" ] && { echo "stopped before $name"; break; }
      python3 -m autotune.cli compile --config @"$chunk" --arch sm_90 --quiet > /dev/null 2>&1
      while [ "$(jobs -rp | wc -l)" -ge 3 ]; do sleep 1; done
      ( python3 -m autotune.cli check --config @"$chunk" --seed "$SEED" --json "$R/check_$name.json" \
          --quiet > "$R/check_$name.txt" 2>&1; echo "rc=$?" >> "$R/check_$name.txt" ) &
      echo "$name compiled at $(( $(date +%s) - t0 )) s"
    done
    wait
    grep -h "valid," "$R"/check_chunk_*.txt | tail -n 40 ;;
  sample)
    shift
    for family in "$@"; do
      sample_file "$family"
      t0=$(date +%s)
      python3 -m autotune.cli check --config @/tmp/sample_$family.json --seed "$SEED" \
        --json "$R/check_sample_$family.json" --quiet > "$R/check_sample_$family.txt" 2>&1
      echo "rc=$? in $(( $(date +%s) - t0 )) s" >> "$R/check_sample_$family.txt"
      tail -n 4 "$R/check_sample_$family.txt"
    done ;;
  versions)
    python3 benchmarks/kernel_versions.py --old .oldtree --shapes llm-prefill \
      --json "$R/kernel_versions_llm_prefill.json" 2>&1 | tee "$R/kernel_versions_llm_prefill.txt" \
      | tail -n 12 ;;
  sanitize)
    variants=${VARIANTS:-benchmarks/configs/structural_variants.json}
    python3 -m autotune.cli compile --config @"$variants" --arch sm_90 --quiet > /dev/null 2>&1
    # Four sanitizer processes at a time on the one GPU: each is mostly host-bound.
    sanitize_variants "$variants" "$R/sanitizers_h200.txt" 4 150
    grep -cE "RACECHECK SUMMARY: 0 hazards|ERROR SUMMARY: 0 errors" "$R/sanitizers_h200.txt"
    grep -E "SUMMARY" "$R/sanitizers_h200.txt" | sort | uniq -c ;;
  esac
done
tar czf "$OUT/revalidate.tgz" -C /tmp revalidate
