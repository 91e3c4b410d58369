#!/usr/bin/env bash
# The GPU runs behind benchmarks/results/: named stages, several per device call, each writing
# into $OUT. Run from the repository root on the GPU host with the wheels the host lacks in
# .whl/ (../shared/gpu-host/fetch-wheels.sh) and, optionally, cubins built off the host and
# packed into .c90pack/*.tgz (benchmarks/pack_cubins.py); the kernel cache is .cubins/.
#
#   bash benchmarks/evidence.sh STAGE [STAGE ...]     e.g.  bash benchmarks/evidence.sh tests host
#
# Validation
#   tests        every GPU test (tests/gpu, and the fault suite's GPU cases), every_valid's
#                sub-spaces sampled (SAMPLE configs each, default 4; SAMPLE=all: every config)
#   validate     a seeded covering sample (FRACTION of the valid configs, default 0.25, SEED
#                14) of each family in FAMILIES (default "sm80 sm90 decode decode90"), compiled
#                on all cores and run through `cute-autotune check`
#   sanitize     racecheck and synccheck (compute-sanitizer, probes/race_probe.py) on each
#                structural variant in VARIANTS (default configs/structural_variants.json)
#   versions     a kernel change: llm-prefill's dispatched configs built from the old tree
#                (.oldtree/, `git archive <commit> | tar -x -C .oldtree`) and from this one,
#                timed side by side beside SDPA (kernel_versions.py)
#   backward     the backward family's GPU tests (every default through the gradient
#                validator, a covering sample, the deterministic mode, stream/graph, autograd
#                through attention(); BWD_K: a pytest -k selection), then backward_bench.py
#                (BWD_CONFIGS: a JSON list of configs to time; default: each head dim's default)
# Measurement (SDPA's default measured in the same run)
#   bench        `cute-autotune bench` and the plain alternating check on SETS (default
#                "llm-prefill llm-decode"), from the tuning database DB (default db/h200.json
#                imported into a scratch database), with the stored speed-ups (timing_agreement.py)
#   decode       the decode families against SDPA and a device copy (decode_bench.py --extra --paged)
#   generalize   untuned dispatch on problems nobody tuned (generalization.py measure --seed
#                SEED), the untuned cases of the dispatch issue (why_cases.py), SDPA through
#                dispatch per head dim (sdpa_through_dispatch.py)
#   e2e          a transformers model with attn_implementation="cute_autotune" against "sdpa"
#                (e2e_model.py; MODES default "eager")
#   host         host time per call, ours against SDPA (host_overhead.py, and --decode)
#   graph        a 24-layer decode step in one CUDA graph, ours against SDPA and a streaming
#                read of the same caches (graph_decode.py)
# Tuning and the database
#   tune         one piece of a tuning session (SHAPES, FAMILIES, TRIALS, STOP_AFTER) into
#                .tuning/h200.db (carried between calls; it comes back in $OUT)
#   record       the recordings --replay serves (sweep.py), one per family in REC
#   workers      a worker killed mid-item and restarted against a plain `tune` (worker_run.py)
#   scaleout     `worker --gpus all` against one worker, one of them killed (scale_out.py;
#                a two-GPU machine)
#   deploy       README command 1 on this host, then attention() from the shipped results
#                (deploy_check.py fresh), then a kernel pack run with no toolkit
#                (deploy_check.py no-toolkit)
set -uo pipefail
if [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export CUTE_AUTOTUNE_CACHE=${CUTE_AUTOTUNE_CACHE:-$PWD/.cubins}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" "$CUTE_AUTOTUNE_CACHE"
B=benchmarks
for pack in .c90pack/*.tgz; do [ -e "$pack" ] && tar xzf "$pack" -C "$CUTE_AUTOTUNE_CACHE"; done
t0=$(date +%s)
at() { echo "$1 rc $2 at $(( $(date +%s) - t0 )) s"; }
# A copy of a SQLite database with what its write-ahead log holds (a plain cp of the main
# file misses the transactions not yet checkpointed into it).
copy_db() { python3 -c "import sqlite3, sys
source, copy = sqlite3.connect(sys.argv[1]), sqlite3.connect(sys.argv[2])
source.backup(copy); copy.close(); source.close()" "$1" "$2"; }
# The seeded covering sample of family $1 as a config list in /tmp/sample_$1.json.
sample_file() { python3 -c "import json
from autotune.model.sampling import covering_sample
from autotune.model.space import load_space
from autotune.model.target import target_for_arch
space = load_space('$1'); configs = space.valid_configs(target_for_arch('sm_90'))
sample = covering_sample(configs, ${FRACTION:-0.25}, seed=${SEED:-14})
json.dump([c.as_dict() for c in sample], open('/tmp/sample_$1.json', 'w'))
print('$1:', len(sample), 'of', len(configs), 'valid configs')"; }
# racecheck + synccheck on each config of the JSON list $1, four processes at a time (each is
# mostly host-bound), each cut at $3 seconds; every report's tail into $2.
sanitize_variants() { python3 -c "import json, sys
for c in json.load(open(sys.argv[1])):
    print(json.dumps(c, separators=(',', ':')))" "$1" > /tmp/variants.txt
  export SANITIZE_TIMEOUT=$3
  run_one() { local cfg; cfg=$(sed -n "${2}p" /tmp/variants.txt)
    { echo "== $1 $cfg"; timeout "$SANITIZE_TIMEOUT" compute-sanitizer --tool "$1" python3 \
        benchmarks/probes/race_probe.py "$cfg" 2>&1 | tail -n 7; } > "/tmp/san_${2}_$1.txt"; }
  export -f run_one; rm -f /tmp/san_*.txt
  for i in $(seq 1 "$(wc -l < /tmp/variants.txt)"); do echo "racecheck $i"; echo "synccheck $i"; done \
    | xargs -P 4 -L 1 bash -c 'run_one "$0" "$1"'
  cat /tmp/san_*.txt > "$2"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv,noheader \
  | tee "$OUT/gpu.txt"

for stage in "$@"; do
case "$stage" in
tests)
  sample=${SAMPLE:-4}; [ "$sample" = all ] && sample=
  CUTE_AUTOTUNE_GPU_SAMPLE=$sample timeout "${TESTS_S:-400}" python3 -m pytest tests/gpu \
    tests/faults -m gpu -q -rfE -p no:cacheprovider --durations=15 > "$OUT/pytest_gpu.txt" 2>&1
  at tests $?; tail -n 25 "$OUT/pytest_gpu.txt" ;;
validate)
  for family in ${FAMILIES:-sm80 sm90 decode decode90}; do
    sample_file "$family"
    python3 -m autotune.cli compile --config @/tmp/sample_$family.json --arch sm_90 --quiet \
      > /dev/null 2>&1
    python3 -m autotune.cli check --config @/tmp/sample_$family.json --seed "${SEED:-14}" \
      --json "$OUT/check_sample_$family.json" --quiet > "$OUT/check_sample_$family.txt" 2>&1
    at "check $family" $?; tail -n 4 "$OUT/check_sample_$family.txt"
  done ;;
backward)
  timeout "${BWD_TESTS_S:-400}" python3 -m pytest tests/gpu/test_backward_gpu.py -q -rfE -s \
    -p no:cacheprovider --durations=10 ${BWD_K:+-k "$BWD_K"} > "$OUT/pytest_backward.txt" 2>&1
  at "backward tests" $?; grep -E "bwd_d|passed|failed|Error" "$OUT/pytest_backward.txt" \
    | cut -c1-240 | tail -n 40
  timeout "${BWD_BENCH_S:-150}" python3 $B/backward_bench.py --calls 20 \
    ${BWD_CONFIGS:+--configs "$BWD_CONFIGS"} --json "$OUT/backward_bench.json" \
    > "$OUT/backward_bench.txt" 2>&1
  at "backward bench" $?; cut -c1-400 "$OUT/backward_bench.txt" | tail -n 8 ;;
sanitize)
  variants=${VARIANTS:-$B/configs/structural_variants.json}
  python3 -m autotune.cli compile --config @"$variants" --arch sm_90 --quiet > /dev/null 2>&1
  sanitize_variants "$variants" "$OUT/sanitizers.txt" "${SANITIZE_S:-150}"
  grep -E "SUMMARY" "$OUT/sanitizers.txt" | sort | uniq -c ;;
versions)
  python3 $B/kernel_versions.py --old .oldtree --shapes llm-prefill \
    --json "$OUT/kernel_versions_llm_prefill.json" > "$OUT/kernel_versions_llm_prefill.txt" 2>&1
  at versions $?; tail -n 12 "$OUT/kernel_versions_llm_prefill.txt" ;;
bench)
  db=${DB:-}
  if [ -z "$db" ]; then
    db="sqlite:////tmp/bench.db"; python3 -m autotune.cli import db/h200.json --no-refit --db "$db" > /dev/null
  fi
  for set in ${SETS:-llm-prefill llm-decode}; do
    name=${set//-/_}
    timeout "${BENCH_S:-400}" python3 $B/timing_agreement.py --db "$db" --shapes "$set" \
      --bench-json "$OUT/bench_${name}.json" --agreement-json "$OUT/timing_agreement_${name}.json" \
      > "$OUT/agreement_${name}.txt" 2>&1
    at "bench $set" $?; tail -n 20 "$OUT/agreement_${name}.txt"
  done ;;
decode)
  timeout "${DECODE_S:-500}" python3 $B/decode_bench.py --extra --paged \
    --json "$OUT/decode_bench.json" > "$OUT/decode_bench.txt" 2>&1
  at decode $?; tail -n 20 "$OUT/decode_bench.txt" ;;
generalize)
  timeout "${GENERALIZE_S:-300}" python3 $B/generalization.py measure --seed "${SEED:-7}" \
    --json "$OUT/generalization_seed${SEED:-7}.json" --calls 30 \
    > "$OUT/generalization_seed${SEED:-7}.txt" 2>&1
  at generalization $?; tail -n 12 "$OUT/generalization_seed${SEED:-7}.txt"
  timeout 120 python3 $B/why_cases.py --json "$OUT/why_cases.json" > "$OUT/why_cases.txt" 2>&1
  at why_cases $?; tail -n 8 "$OUT/why_cases.txt"
  timeout 120 python3 $B/sdpa_through_dispatch.py --json "$OUT/sdpa_through_dispatch.json" \
    > "$OUT/sdpa_through_dispatch.txt" 2>&1
  at sdpa_through_dispatch $?; tail -n 8 "$OUT/sdpa_through_dispatch.txt" ;;
e2e)
  timeout "${E2E_S:-400}" python3 $B/e2e_model.py --json "$OUT/e2e_model.json" \
    --modes "${MODES:-eager}" > "$OUT/e2e_model.txt" 2>&1
  at e2e $?; grep -v -i warn "$OUT/e2e_model.txt" | tail -n 20 | cut -c1-200 ;;
host)
  python3 $B/host_overhead.py --json "$OUT/host_overhead.json" > "$OUT/host_overhead.txt" 2>&1
  python3 $B/host_overhead.py --decode --json "$OUT/host_overhead_decode.json" \
    > "$OUT/host_overhead_decode.txt" 2>&1
  at host $?; tail -n 8 "$OUT/host_overhead.txt" "$OUT/host_overhead_decode.txt" ;;
graph)
  timeout "${GRAPH_S:-300}" python3 $B/graph_decode.py --json "$OUT/graph_decode.json" \
    > "$OUT/graph_decode.txt" 2>&1
  at graph $?; cut -c1-300 "$OUT/graph_decode.txt" | tail -n 8 ;;
tune)
  mkdir -p .tuning; piece=$(date +%s)
  python3 -m autotune.cli tune --shapes "${SHAPES:-llm-prefill}" --trials "${TRIALS:-16}" \
    --family "${FAMILIES:-sm90}" --skip-tuned --stop-after "${STOP_AFTER:-420}" \
    --db "sqlite:///$PWD/.tuning/h200.db" --json "$OUT/tune_piece_$piece.json" --quiet \
    > "$OUT/tune_piece_$piece.txt" 2>&1
  at tune $?; tail -n 40 "$OUT/tune_piece_$piece.txt"
  copy_db .tuning/h200.db "$OUT/h200.db" ;;
record)
  for family in ${REC:-sm80}; do
    case "$family" in
      decode|decode90) args=(--shape-set llm-decode --head-dim 128 --dtype bf16 --pick 0 4 6 9 16 20 25 27) ;;
      *) args=(--shape-set llm-prefill --head-dim 128 --dtype fp16 --causal false) ;;
    esac
    python3 -m autotune.cli compile --family "$family" --head-dim 128 --arch sm_90 --jobs 16 \
      --quiet > /dev/null 2>&1
    timeout "${RECORD_S:-500}" python3 $B/sweep.py --family "$family" "${args[@]}" \
      --json "$OUT/sweep_${family}_h200.json.gz" > "$OUT/sweep_$family.txt" 2>&1
    at "record $family" $?; tail -n 4 "$OUT/sweep_$family.txt"
  done ;;
workers|scaleout)
  f=/tmp/$stage; rm -rf "$f"; mkdir -p "$f"
  timeout 90 python3 -m autotune.cli compile --family sm90 --head-dim 128 --dtype fp16 \
    --causal false --arch sm_90 --jobs 16 --quiet > "$f/compile.txt" 2>&1
  if [ "$stage" = workers ]; then
    python3 $B/worker_run.py --out "$f" --trials "${TRIALS:-8}" --rerank-top 2 --kill-after 3 \
      --until "${UNTIL:-420}" ${REPLAY:+--replay "$REPLAY"} > "$f/run.txt" 2>&1
  else
    python3 $B/scale_out.py --out "$f" --trials "${TRIALS:-24}" --kill-after 20 --lease 6 \
      --until "${UNTIL:-480}" ${REPLAY:+--replay "$REPLAY"} > "$f/run.txt" 2>&1
  fi
  at "$stage" $?; tar czf "$OUT/$stage.tgz" -C /tmp "$stage"; tail -n 12 "$f/run.txt" ;;
deploy)
  # README command 1 as written, pip resolving from the carried wheels (.whl-fresh: what the
  # package declares that the host lacks) and the host's own torch
  (export PIP_NO_INDEX=1 PIP_FIND_LINKS="$PWD/.whl $PWD/.whl-fresh" PIP_BREAK_SYSTEM_PACKAGES=1 \
     PYTHONPATH= HOME=/tmp/fresh-home; mkdir -p "$HOME"; unset CUTE_AUTOTUNE_CACHE CUTE_AUTOTUNE_DB
   python3 -m pip install -q ".[test]" && cute-autotune demo
   echo "README command 1 exit status: $?"
   cd /tmp && python3 "$OLDPWD/$B/deploy_check.py" fresh) > "$OUT/fresh_install.txt" 2>&1
  tail -n 15 "$OUT/fresh_install.txt"
  python3 -m autotune.cli kernels pack --arch sm_90 --out /tmp/pack --jobs 16 --quiet \
    > "$OUT/kernels_pack.txt" 2>&1
  py=$(command -v python3); mkdir -p /tmp/empty_path
  mv /usr/local/cuda /usr/local/cuda.hidden
  env -u CUDA_HOME -u CUDA_PATH -u CXX PATH=/tmp/empty_path CUTE_AUTOTUNE_KERNELS=/tmp/pack \
    CUTE_AUTOTUNE_CACHE=/tmp/empty_cache CUTE_AUTOTUNE_DB=sqlite:////tmp/empty.db \
    "$py" $B/deploy_check.py no-toolkit > "$OUT/no_toolkit_check.txt" 2>&1
  at "no-toolkit check" $?
  mv /usr/local/cuda.hidden /usr/local/cuda; tail -n 10 "$OUT/no_toolkit_check.txt" ;;
*) echo "unknown stage $stage (the header lists them)"; exit 2 ;;
esac
done
