#!/usr/bin/env bash
# The H200 runs behind the committed evidence, one stage per device call (each < 10 minutes).
# Run from the repository root on the GPU host, with .whl/ (fetch-wheels.sh) and the prebuilt
# cubin cache .cubins/ carried; results land in $OUT.
#   bash benchmarks/h200_evidence.sh tests64   # GPU tests: every D=64 config (both dtypes, masks)
#   bash benchmarks/h200_evidence.sh tests128  # every D=128 config and the remaining GPU tests
#   bash benchmarks/h200_evidence.sh bench     # D=64 sweep and throughput, compile throughput,
#                                              # host overhead, the demo
#   bash benchmarks/h200_evidence.sh sweep     # exhaustive timing sweep for the replay backend
#   bash benchmarks/h200_evidence.sh overhead  # host time per call, ours vs SDPA
#   TRIALS=16 STOP_AFTER=470 bash benchmarks/h200_evidence.sh tune  # one piece of llm-prefill
#                                              # (SHAPES=decode-tuning FAMILIES=decode,sm90: the
#                                              # decode family's tuning, issue 15)
#   bash benchmarks/h200_evidence.sh dispatch  # bench llm-prefill and untuned-probe against SDPA
#   bash benchmarks/h200_evidence.sh fresh     # README command 1 on this host (carry .whl-fresh
#                                              # too), then attention()
#                                              # from the shipped db/ results, nothing tuned
#   PIECE=128-fp16 bash benchmarks/h200_evidence.sh sm90space  # every valid sm90 config of one
#                                              # (head dim, dtype), both masks, through the validator
#                                              # (cubins prebuilt into .cubins90/; merge the pieces
#                                              # with benchmarks/merge_checks.py)
#   D=128 ALSO_CHECK=256 bash benchmarks/h200_evidence.sh sm90piece  # kind nvidia-h200-x2: one D of
#                                              # the sm90 family, every valid config (both dtypes
#                                              # and masks) through the validator, then its
#                                              # llm-prefill problems tuned with --family sm90,
#                                              # one dtype per GPU (carry .whl .tuning .c90pack)
#   bash benchmarks/h200_evidence.sh testspower  # the GPU tests (every cubin they need carried
#                                              # in .c90pack) and the power-steady probe of
#                                              # the D=128 fp16 non-causal shapes (ours and SDPA
#                                              # alone and interleaved, clock and power sampled)
#   bash benchmarks/h200_evidence.sh gpusuite  # every GPU test, the every_valid sub-spaces of both
#                                              # families included (all cubins carried)
#   bash benchmarks/h200_evidence.sh final     # README command 1's main job with an empty cache
#                                              # and database, the tuned-dispatch bench of both
#                                              # families (PREFIX=sm90_bench), the GPU tests and
#                                              # the host overhead; one tarball back
#   OLD_HASH=<hash> bash benchmarks/h200_evidence.sh v3  # a new sm90 kernel version: its
#                                              # structural variants validated, timed against the
#                                              # previous version beside SDPA, sanitizers
#   SAMPLE=4 bash benchmarks/h200_evidence.sh faults  # issue 12: raw torch SDPA on a misaligned
#                                              # view (its own process), the fault suite's GPU
#                                              # tests and every GPU test (sub-spaces sampled,
#                                              # SAMPLE configs each; cubins in .c90pack)
#   bash benchmarks/h200_evidence.sh noregret  # issue 13: llm-prefill finalists re-ranked beside
#                                              # torch SDPA, llm-decode tuned over SDPA's backends,
#                                              # GPU tests of SDPA dispatch (.c90pack carried)
#   SETS=llm-prefill bash benchmarks/h200_evidence.sh agreement  # bench beside the plain
#                                              # alternating-call check and the stored speed-ups
#                                              # (.tuning/h200.db from noregret carried)
#   bash benchmarks/h200_evidence.sh final13   # issue 13's evidence at the final regime: the
#                                              # re-ranking, llm-decode, agreement and bench of both
#                                              # sets, the SDPA dispatch tests, the regret report
#   bash benchmarks/h200_evidence.sh refactor  # issue 14's Python refactor on the GPU: every GPU
#                                              # test (sub-spaces sampled, SAMPLE configs each,
#                                              # through `check` and the typed worker protocol),
#                                              # a sweep.py smoke (the one trial), README
#                                              # command 1's demo with an empty database
#   bash benchmarks/h200_evidence.sh decode15  # issue 15's decode family: its GPU tests (KV caches,
#                                              # splits, packing, append, CUDA graph), the decode
#                                              # bench beside SDPA and a device copy, and a sample
#                                              # of its configs through `check` (cubins in .c90pack)
#   UNTIL=540 bash benchmarks/h200_evidence.sh decode15v3  # decode kernel v3: its GPU tests,
#                                              # the bench, a piece of decode-tuning (.tuning
#                                              # carried), CHECK=1: D=128 configs through check
#   UNTIL=540 bash benchmarks/h200_evidence.sh decode15probe  # decode B=1 and paged probe,
#                                              # the transformers model bench and the SDPA
#                                              # drop-in GPU tests (issue 16), sanitizers on the
#                                              # decode variants, every D=128 decode build checked
#   bash benchmarks/h200_evidence.sh decode15v4  # decode kernel v4: builds, GPU tests, bench,
#                                              # a covering sample through check, sanitizers,
#                                              # the model bench with a host profile
#   UNTIL=520 bash benchmarks/h200_evidence.sh decode15tune  # the model bench's host profile,
#                                              # then decode-tuning's cache-kind problems
#                                              # searched again (.tuning carried; one tarball)
#   bash benchmarks/h200_evidence.sh notoolkit16  # a kernel pack for db/, then attention() from
#                                              # it with no nvcc, cuda.h or C++ compiler
#   REC="sm90 sm80" bash benchmarks/h200_evidence.sh record16  # --replay recordings (issue
#                                              # 16), one per family in REC (decode, sm90,
#                                              # sm80): every build through check, the sweep
#   bash benchmarks/h200_evidence.sh decode90  # the decode90 family (issue 15): its GPU tests
#                                              # and the decode family's, every build through
#                                              # check beside racecheck + synccheck on its
#                                              # structural variants, then the decode bench of
#                                              # the Lq >= 4 problems, both families searched
#   UNTIL=540 bash benchmarks/h200_evidence.sh b8retune  # decode_bound.py, the GPU tests of
#                                              # sm80, tuning, timing and decode dispatch, then
#                                              # decode_b8_retune.toml tuned with decode90
#                                              # (.tuning and .c90pack carried; ALT=1 checks
#                                              # the re-tuned problems against SDPA)
#   UNTIL=540 bash benchmarks/h200_evidence.sh decodekv  # decode90 on KV caches: BENCH=1 the
#                                              # whole decode bench, then decode-tuning's cache
#                                              # kinds (DENSE1=1: and its dense Lq=1 problems)
#                                              # tuned with FAMILIES (both split-KV families
#                                              # unless set), CAUSAL=true: only the Lq >= 4
#                                              # cache problems (.tuning carried)
#   UNTIL=540 bash benchmarks/h200_evidence.sh decode90tune  # BENCH=1: the whole decode bench
#                                              # (both families) and the B=1 floor probe; then
#                                              # a piece of decode-tuning's dense Lq >= 4
#                                              # problems with decode and decode90 (.tuning
#                                              # carried and returned; one tarball)
#   UNTIL=540 bash benchmarks/h200_evidence.sh hostlq1  # issue 15, the decode call's host cost:
#                                              # host_overhead.py --decode with the last
#                                              # commit's package (.c90pack/old_tree.tgz) and
#                                              # with this tree's, the decode GPU tests, then
#                                              # benchmarks/configs/decode_lq1_retune.toml tuned
#                                              # with decode90 beside SDPA (.tuning carried;
#                                              # OLD=0: no last-commit run; ALT=1: attention()
#                                              # from db/h200.json against SDPA alternated;
#                                              # TESTS=0, HOST=0: no GPU tests, no host cost)
#   bash benchmarks/h200_evidence.sh sm90      # sm90 structural variants: validator, timing
#                                              # against SDPA, racecheck and synccheck (cubins
#                                              # prebuilt into .cubins90/, carried)
#   bash benchmarks/h200_evidence.sh workers   # issue 17: `cute-autotune worker` draining three
#                                              # llm-prefill items (sm90, D=128 fp16), killed
#                                              # by SIGKILL mid-item and restarted, against a
#                                              # plain `tune`; the winners of both re-timed
#                                              # together (benchmarks/worker_run.py; the sm90
#                                              # D=128 fp16 non-causal cubins in .c90pack)
#   bash benchmarks/h200_evidence.sh scaleout  # issue 18 item 1, kind nvidia-h200-x2: the eight
#                                              # llm-prefill items (sm90, D=128 fp16) drained by
#                                              # one worker, then by `worker --gpus all` with one
#                                              # of the two killed mid-item; trials/min of both,
#                                              # winners re-timed together
#                                              # (benchmarks/scale_out.py; carry .whl .c90pack)
#   bash benchmarks/h200_evidence.sh epilogue  # issue 15: decode90's epilogue, old kernel and new
#                                              # (carry .c90pack .oldtree)
#   bash benchmarks/h200_evidence.sh pair      # issue 15: two splits reduced by exchange, old
#                                              # kernel and new (carry .c90pack .oldtree)
#   TREES=".oldtree .treeB ." bash benchmarks/h200_evidence.sh paircode  # issue 15: the
#                                              # exchange's code size, three kernels in turn
#                                              # (carry .c90pack and the trees)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUTE_AUTOTUNE_CACHE=$PWD/.cubins
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# Cubins packed by benchmarks/pack_cubins.py and carried in .c90pack/, into the kernel cache.
# (Function variables are `local`: a loop variable named like a stage's once overwrote it.)
# A copy of a SQLite tuning database with what its write-ahead log holds (a plain cp of the
# main file misses the transactions not yet checkpointed into it: the last tuned problem's
# best row, in the decodekv call of 2026-12-02).
copy_db() { python3 -c "import sqlite3, sys
source, copy = sqlite3.connect(sys.argv[1]), sqlite3.connect(sys.argv[2])
source.backup(copy); copy.close(); source.close()" "$1" "$2"; }
unpack_cubins() { local pack; mkdir -p "$CUTE_AUTOTUNE_CACHE"
  for pack in .c90pack/*.tgz; do [ -e "$pack" ] && tar xzf "$pack" -C "$CUTE_AUTOTUNE_CACHE"; done
  return 0; }
# The configs of the shipped H200 results (db/h200.json), as a JSON list for --config @file.
shipped_configs() { python3 -c "import json
print(json.dumps([r['config'] for r in json.load(open('db/h200.json'))['results']]))"; }
# PRECOMPILE="64" (head dims): while the GPUs work, the rest of these head dims' sm90 space is
# compiled on idle cores (nice, PRE_JOBS of them) into /tmp/pre until PRE_UNTIL seconds after
# $t0; precompile_pack then packs it into $OUT for the next call to carry.
precompile_start() { local pack; [ -n "${PRECOMPILE:-}" ] || return 0; mkdir -p /tmp/pre
  for pack in .c90pack/*.tgz; do [ -e "$pack" ] && tar xzf "$pack" -C /tmp/pre; done
  (CUTE_AUTOTUNE_CACHE=/tmp/pre timeout $(( ${PRE_UNTIL:-500} - ($(date +%s) - t0) )) \
     nice -n 10 python3 -m autotune.cli compile --family sm90 --head-dim $PRECOMPILE \
     --causal both --jobs "${PRE_JOBS:-24}" --quiet > "$OUT/precompile.txt" 2>&1) & }
precompile_pack() { [ -n "${PRECOMPILE:-}" ] || return 0; wait
  python3 benchmarks/pack_cubins.py "$OUT/pre_d${PRECOMPILE// /_}.tgz" --cache /tmp/pre \
    --family sm90 --head-dim $PRECOMPILE; }
# tune_decode90 SHAPES LEFT TRIALS STEM LINES: SHAPES searched with decode90 beside SDPA's
# backends into .tuning/h200.db (--skip-tuned: each problem once over calls) for at most LEFT
# seconds, if more than 40 are left; STEM.json and STEM.txt, the last LINES lines shown.
tune_decode90() { [ "$2" -gt 40 ] || return 0
  python3 -m autotune.cli tune --shapes "$1" --family decode90 --trials "$3" --rerank-top 3 \
    --skip-tuned --stop-after "$2" --db "sqlite:///$PWD/.tuning/h200.db" --json "$4.json" \
    --quiet > "$4.txt" 2>&1
  echo "tune rc $? at $(( $(date +%s) - t0 )) s"; tail -n "$5" "$4.txt" | cut -c1-160; }
. benchmarks/sanitize_variants.sh  # sanitize_variants LIST OUT [PARALLEL] [TIMEOUT]
# old_and_new_kernels DIR PROBE-ARGS...: benchmarks/decode_tile_probe.py from each tree of
# TREES in turn, twice, each run its own plain alternation (DIR/<tree>_<round>.*,
# DIR/old_new_h200.txt). TREES defaults to ".oldtree .": the previous kernel's tree (`git
# archive` of its commit with this probe copied in, its cubins carried), named old, then this
# one, named new; another tree .treeX is named X. Then, SANITIZE=1, decode90's GPU tests
# (TEST_FILES) beside racecheck and synccheck of its structural variants.
old_and_new_kernels() { local f=$1 round tree name names=""; shift; mkdir -p "$f"; unpack_cubins
  t0=$(date +%s)
  for round in 1 2; do
    for tree in ${TREES:-.oldtree .}; do
      case $tree in .oldtree) name=old ;; .) name=new ;; *) name=${tree#.tree} ;; esac
      [ "$round" = 1 ] && names="$names ${name}_1 ${name}_2"
      (cd "$tree" && PYTHONPATH=/tmp/site:$PWD timeout 120 python3 \
         benchmarks/decode_tile_probe.py "$@" --causal --json "$f/${name}_$round.json" \
         > "$f/${name}_$round.txt" 2>&1)
      echo "$name $round rc $? at $(( $(date +%s) - t0 )) s"
    done
  done
  python3 -c "import json, sys
names = sys.argv[1:]
runs = {n: {r['call']: r['us'] for r in json.load(open(f'$f/{n}.json'))['rows']} for n in names}
print(f\"{'call':<66} \" + ' '.join(f'{n:>8}' for n in names))
for call in runs[names[0]]:
    print(f'{call:<66} ' + ' '.join(f'{runs[n].get(call, 0):8.2f}' for n in names))" $names \
    | tee "$f/old_new_h200.txt"
  [ "${SANITIZE:-1}" = 1 ] || return 0
  (sanitize_variants benchmarks/configs/decode90_structural_variants.json \
     "$f/sanitize_decode90.txt" 4 240) &
  timeout "${TESTS_S:-240}" python3 -m pytest -q -p no:cacheprovider -rfE --durations=5 \
    ${TEST_FILES:-tests/gpu/test_decode90_gpu.py} > "$f/pytest_decode90.txt" 2>&1
  echo "tests rc $? at $(( $(date +%s) - t0 )) s"; tail -n 3 "$f/pytest_decode90.txt"
  wait; grep -cE "0 hazards displayed|ERROR SUMMARY: 0 errors" "$f/sanitize_decode90.txt"
  grep -E "RACECHECK SUMMARY|ERROR SUMMARY" "$f/sanitize_decode90.txt" | sort | uniq -c; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv,noheader
case "${1:?stage}" in
tests64|tests128)
  if [ "$1" = tests64 ]; then sel="every_valid and 64 and not sm90"; else sel="not (every_valid and 64) and not sm90"; fi
  CUTE_AUTOTUNE_EVIDENCE_DIR=/tmp/checks_$1 python3 -m pytest tests/gpu -v -rA -k "$sel" 2>&1 | tee "$OUT/pytest_gpu_$1.txt" | grep -E "PASS|FAIL|ERROR|passed|failed" | tail -20
  python3 benchmarks/merge_checks.py "$OUT/check_$1.json" /tmp/checks_$1/*.json \
    --command "python3 -m pytest tests/gpu -k '$sel' (each sub-space test runs: cute-autotune check --head-dim D --dtype T --causal C --json ...)"
  ;;
bench)
  # Everything that needs the D=64 cubins besides the tests, plus compile throughput and the
  # main job: the D=64 sweep shapes, the D=64 throughput table, the demo.
  python3 benchmarks/sweep.py --shapes 3 4 6 --json "$OUT/sweep_d64.json" 2>&1 | tail -4
  # (the D=64 throughput table came from sm80_throughput.py, removed: superseded by bench)
  python3 benchmarks/compile_throughput.py --configs 32 --json "$OUT/compile_throughput_h200.json" > /dev/null 2>&1; cat "$OUT/compile_throughput_h200.json"
  python3 benchmarks/host_overhead.py --json "$OUT/host_overhead_h200.json" 2>&1 | tail -4
  python3 -m autotune.cli demo > "$OUT/demo_h200.txt" 2>&1; tail -15 "$OUT/demo_h200.txt"
  ;;
sweep)
  python3 benchmarks/sweep.py --json "$OUT/sweep_sm80_h200.json" 2>&1 | tee "$OUT/sweep_sm80_h200.txt"
  ;;
overhead)
  python3 benchmarks/host_overhead.py --json "$OUT/host_overhead_h200.json" 2>&1 | tee "$OUT/host_overhead_h200.txt"
  ;;
tune)
  # One piece (< 10 min) of a tuning session of SHAPES (llm-prefill unless set, e.g.
  # SHAPES=decode-tuning FAMILIES=decode,sm90 for issue 15); the database travels in .tuning/
  # (carried) and comes back in $OUT, so the next piece resumes it. FAMILIES=sm80 (the shipped
  # session-2 sm80 tuning) unless set, e.g. FAMILIES=sm80,sm90 to let both families compete.
  mkdir -p .tuning; piece=$(date +%s); unpack_cubins
  python3 -m autotune.cli tune --shapes "${SHAPES:-llm-prefill}" --trials "${TRIALS:-16}" --skip-tuned \
    --family "${FAMILIES:-sm80}" \
    --stop-after "${STOP_AFTER:-420}" --db "sqlite:///$PWD/.tuning/h200.db" \
    --json "$OUT/tune_piece_$piece.json" --quiet 2>&1 | tail -80 | tee "$OUT/tune_piece_$piece.txt"
  copy_db .tuning/h200.db "$OUT/h200.db"
  ;;
dispatch)
  # Tuned dispatch from the session's database against SDPA, in one run per shape set.
  # Cubins packed by benchmarks/pack_cubins.py (carried in .c90pack/) save the compiles;
  # PREFIX=sm90_bench names the files of the run with both families.
  unpack_cubins
  db="sqlite:///$PWD/.tuning/h200.db"
  for set in llm-prefill untuned-probe; do
    stem=${PREFIX:-bench}_${set//-/_}_h200
    python3 -m autotune.cli bench --shapes "$set" --db "$db" --json "$OUT/$stem.json" \
      --plot "$OUT/$stem.png" > "$OUT/$stem.txt" 2>&1; tail -n 80 "$OUT/$stem.txt"
  done
  ;;
fresh)
  # README command 1, unchanged, on this offline host: pip resolves from the carried wheels
  # (.whl has setuptools for the build; .whl-fresh, carried for this stage only, has
  # cuda-python and the rest of what nvidia-cutlass declares) and the host's own torch. Then, with an empty kernel cache and no tuning database, attention() must answer
  # from the shipped db/ results.
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$PWD/.whl $PWD/.whl-fresh" PIP_BREAK_SYSTEM_PACKAGES=1
  export PYTHONPATH= HOME=/tmp/fresh-home; mkdir -p "$HOME"; unset CUTE_AUTOTUNE_CACHE CUTE_AUTOTUNE_DB
  (python3 -c "import torch" 2>/dev/null || python3 -m pip install torch==2.13.0; python3 -m pip install ".[test]" && cute-autotune demo) > "$OUT/fresh_install_h200.txt" 2>&1
  echo "README command 1 exit status: $?" >> "$OUT/fresh_install_h200.txt"
  tail -n 25 "$OUT/fresh_install_h200.txt"
  (cd /tmp && python3 "$OLDPWD/benchmarks/fresh_dispatch.py") 2>&1 | tee "$OUT/fresh_dispatch_h200.txt"
  ;;
sm90)
  export CUTE_AUTOTUNE_CACHE=$PWD/.cubins90
  variants=benchmarks/configs/sm90_variants.json
  timeout 240 python3 -m autotune.cli check --config @$variants --json "$OUT/sm90_check_h200.json" \
    --quiet > "$OUT/sm90_check_h200.txt" 2>&1; tail -n 72 "$OUT/sm90_check_h200.txt"
  # (the best validated variants against SDPA came from sm80_throughput.py, removed: superseded
  # by whole-space tuning and `cute-autotune bench`)
  # One config per structural variant (D=128 fp16 causal, 128x128 tile): plain, overlap,
  # ping-pong, and the same three persistent.
  for i in 2 5 0 1 3 4; do
    cfg=$(python3 -c "import json,sys; c=[x for x in json.load(open('$variants')) if x['head_dim']==128 and x['dtype']=='fp16' and x['causal'] and x['block_m']==128 and x['block_n']==128 and x['consumer_wgs']==2 and x['kv_stages']==2]; print(json.dumps(c[$i]))")
    for tool in racecheck synccheck; do
      echo "== $tool $cfg"
      timeout 40 compute-sanitizer --tool $tool python3 benchmarks/race_probe.py "$cfg" 2>&1 | tail -n 6
    done
  done > "$OUT/sm90_sanitizers_h200.txt" 2>&1; grep -E "^==|ERROR SUMMARY|RACECHECK SUMMARY|finite" "$OUT/sm90_sanitizers_h200.txt" | tail -n 60
  ;;
sm90space)
  export CUTE_AUTOTUNE_CACHE=$PWD/.cubins90
  d=${PIECE%-*}; dt=${PIECE#*-}
  timeout 570 python3 -m autotune.cli check --family sm90 --head-dim "$d" --dtype "$dt" \
    --causal both --json "$OUT/sm90_check_d${d}_$dt.json" --quiet > "$OUT/sm90_check_d${d}_$dt.txt" 2>&1
  tail -n 3 "$OUT/sm90_check_d${d}_$dt.txt"
  ;;
sm90piece)
  # Cubins prebuilt on the 2-core machine travel packed (benchmarks/pack_cubins.py): the sm90
  # space and the sm80 best configs, which defend their place in each problem's re-timing.
  # What is missing is compiled here on all cores. Then each dtype on its own GPU: the
  # validator over every valid config of (D, dtype), both masks; then tuning of that dtype's
  # llm-prefill problems into its own copy of the session's database (merged afterwards with
  # `cute-autotune export` / `import`). Everything comes back in one tarball.
  d=${D:?D=64 or D=128}; t0=$(date +%s); p=/tmp/piece_d$d; mkdir -p "$p"
  export CUTE_AUTOTUNE_CACHE=$PWD/.cubins90; unpack_cubins
  # ALSO_CHECK: head dims validated whole but not tuned (the issue's D=256).
  python3 -m autotune.cli compile --family sm90 --head-dim "$d" ${ALSO_CHECK:-} --causal both \
    --json "$p/compile_d$d.json" --quiet > "$p/compile_d$d.txt" 2>&1; tail -n 1 "$p/compile_d$d.txt"
  echo "compiled in $(( $(date +%s) - t0 )) s"
  precompile_start
  gpu=0; pids=
  for dt in fp16 bf16; do
    (export CUDA_VISIBLE_DEVICES=$gpu
     timeout 240 python3 -m autotune.cli check --family sm90 --head-dim "$d" --dtype $dt \
       --causal both --json "$p/sm90_check_d${d}_$dt.json" --quiet > "$p/sm90_check_d${d}_$dt.txt" 2>&1
     echo "$dt check done at $(( $(date +%s) - t0 )) s: $(tail -n 1 "$p/sm90_check_d${d}_$dt.txt")"
     for x in ${ALSO_CHECK:-}; do
       timeout 120 python3 -m autotune.cli check --family sm90 --head-dim "$x" --dtype $dt \
         --causal both --json "$p/sm90_check_d${x}_$dt.json" --quiet > "$p/sm90_check_d${x}_$dt.txt" 2>&1
       echo "D=$x $dt: $(tail -n 1 "$p/sm90_check_d${x}_$dt.txt")"
     done
     copy_db .tuning/h200.db "$p/tune_d${d}_$dt.db"
     python3 -m autotune.cli tune --shapes llm-prefill --head-dim "$d" --dtype $dt --family sm90 \
       --trials "${TRIALS:-24}" --skip-tuned --stop-after $(( ${STOP_AT:-500} - ($(date +%s) - t0) )) \
       --db "sqlite:///$p/tune_d${d}_$dt.db" --json "$p/tune_d${d}_$dt.json" --quiet \
       > "$p/tune_d${d}_$dt.txt" 2>&1
     echo "$dt tune done at $(( $(date +%s) - t0 )) s") &
    pids="$pids $!"; gpu=$((gpu + 1))
  done
  wait $pids
  tar czf "$OUT/sm90piece_d$d.tgz" -C /tmp "piece_d$d"
  precompile_pack
  for dt in fp16 bf16; do tail -n 22 "$p/tune_d${d}_$dt.txt"; done
  ;;
gpusuite)
  f=/tmp/gpusuite; mkdir -p "$f"; unpack_cubins
  CUTE_AUTOTUNE_EVIDENCE_DIR=$f/checks timeout "${UNTIL:-450}" python3 -m pytest tests/gpu -v -rA \
    > "$f/pytest_gpu_all.txt" 2>&1; echo "pytest rc $?"
  tar czf "$OUT/gpusuite.tgz" -C /tmp gpusuite; grep -E "PASSED|FAILED|ERROR" "$f/pytest_gpu_all.txt" \
    | grep -v "^PASSED\|^FAILED" | tail -40; tail -n 1 "$f/pytest_gpu_all.txt"
  ;;
faults)
  f=/tmp/faults; mkdir -p "$f"; unpack_cubins
  # What torch's own default backend does with a view 2 bytes off 16-byte alignment (the reason
  # attention() copies such inputs first); its own process, since it may break the context.
  timeout 60 python3 - > "$f/misaligned_sdpa.txt" 2>&1 <<'PY'
import torch, torch.nn.functional as F
print(torch.__version__, torch.backends.cudnn.version(), torch.cuda.get_device_name())
base = torch.randn(2, 8, 512, 136, device="cuda", dtype=torch.float16)
q = base[..., 1:129]
k, v = (torch.randn(2, 8, 512, 128, device="cuda", dtype=torch.float16) for _ in range(2))
ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
print("q.data_ptr() % 16 =", q.data_ptr() % 16)
try:
    out = F.scaled_dot_product_attention(q, k, v)
    print("SDPA default on the view: rel err", float((out.float() - ref).norm() / ref.norm()))
    torch.cuda.synchronize()
    print("a later CUDA op:", float(torch.ones(1000, device="cuda").sum()))
except Exception as exc:  # noqa: BLE001
    print("error:", type(exc).__name__, str(exc)[:300])
PY
  echo "raw SDPA probe rc $?"; cat "$f/misaligned_sdpa.txt"
  CUTE_AUTOTUNE_GPU_SAMPLE=${SAMPLE:-4} CUTE_AUTOTUNE_EVIDENCE_DIR=$f/checks \
    timeout "${UNTIL:-480}" python3 -m pytest tests/faults tests/gpu -m gpu -v -rA \
    > "$f/pytest_gpu.txt" 2>&1; echo "pytest rc $?"
  tar czf "$OUT/faults.tgz" -C /tmp faults
  grep -E "^(FAILED|ERROR)" "$f/pytest_gpu.txt" | head -20; tail -n 1 "$f/pytest_gpu.txt"
  ;;
testspower)
  f=/tmp/testspower; mkdir -p "$f"; unpack_cubins
  timeout 240 python3 -m pytest tests/gpu -v -rA -k "not every_valid" > "$f/pytest_gpu.txt" 2>&1
  tail -n 1 "$f/pytest_gpu.txt"; tar czf "$OUT/testspower.tgz" -C /tmp testspower
  timeout 200 python3 benchmarks/interleave_probe.py --db "sqlite:///$PWD/.tuning/h200.db" \
    --problem 2,16,16,4096,128,fp16,false --problem 1,16,16,8192,128,fp16,false \
    --settle-s 3 --rounds 25 --json "$f/power_probe_h200.json" 2>&1 | tee "$f/power_probe_h200.txt"
  tar czf "$OUT/testspower.tgz" -C /tmp testspower
  ;;
notoolkit16)
  # Issue 16, part 4: a kernel pack built here for db/ (`cute-autotune kernels pack`), then
  # attention() and attention_with_kvcache() run from it with the CUDA toolkit and the C++
  # compiler out of reach (/usr/local/cuda renamed for the run, PATH empty, CUDA_HOME unset)
  # and an empty kernel cache (benchmarks/no_toolkit_check.py). One tarball back.
  f=/tmp/notoolkit16; mkdir -p "$f"; t0=$(date +%s)
  python3 -m autotune.cli kernels pack --arch sm_90 --out /tmp/pack --jobs 16 --quiet \
    > "$f/kernels_pack.txt" 2>&1; echo "pack rc $? at $(( $(date +%s) - t0 )) s"
  du -sh /tmp/pack >> "$f/kernels_pack.txt"; tail -n 3 "$f/kernels_pack.txt"
  py=$(command -v python3); mkdir -p /tmp/empty_path
  mv /usr/local/cuda /usr/local/cuda.hidden && echo "toolkit hidden"
  env -u CUDA_HOME -u CUDA_PATH -u CXX PATH=/tmp/empty_path CUTE_AUTOTUNE_KERNELS=/tmp/pack \
    CUTE_AUTOTUNE_CACHE=/tmp/empty_cache CUTE_AUTOTUNE_DB=sqlite:////tmp/empty.db \
    "$py" benchmarks/no_toolkit_check.py > "$f/no_toolkit_check.txt" 2>&1
  echo "no-toolkit check rc $? at $(( $(date +%s) - t0 )) s"
  mv /usr/local/cuda.hidden /usr/local/cuda
  tar czf "$OUT/notoolkit16.tgz" -C /tmp notoolkit16; tail -n 30 "$f/no_toolkit_check.txt"
  ;;
decode15tune)
  # After a decode kernel change (issue 15): the model bench with a host profile of our decode
  # step, then the KV-cache-kind problems of decode-tuning (KINDS) searched again into
  # .tuning/h200.db (carried), the time left shared between the kinds. Everything comes back as
  # one tarball ($OUT takes few files).
  f=/tmp/decode15tune; mkdir -p "$f" .tuning; unpack_cubins; t0=$(date +%s)
  timeout 100 python3 benchmarks/model_bench.py --json "$f/model_bench_h200.json" --host-profile 45 \
    > "$f/model_bench_h200.txt" 2>&1; echo "model bench rc $? at $(( $(date +%s) - t0 )) s"
  set -- ${KINDS:-seqlens paged16 paged64}
  while [ $# -gt 0 ]; do
    budget=$(( (${UNTIL:-520} - ($(date +%s) - t0) - 20) / $# ))
    python3 -m autotune.cli tune --shapes decode-tuning --kv-cache "$1" --family decode \
      --trials "${TRIALS:-8}" --rerank-top 3 --stop-after "$budget" \
      --db "sqlite:///$PWD/.tuning/h200.db" --json "$f/tune_$1.json" --quiet > "$f/tune_$1.txt" 2>&1
    echo "tune $1 rc $? at $(( $(date +%s) - t0 )) s"; shift
  done
  copy_db .tuning/h200.db "$f/h200.db"; tar czf "$OUT/decode15tune.tgz" -C /tmp decode15tune
  grep -A4 "^phase" "$f/model_bench_h200.txt"; tail -n 8 "$f"/tune_*.txt | cut -c1-200
  ;;
decode15v4)
  # Decode kernel v4 (issue 15), one call: the builds of .prebuild.json (carried: the bench's
  # candidates, the GPU tests' configs and the family's defaults, the covering sample
  # configs/decode_v4_sample.json and the structural variants) compiled on all cores, the decode
  # GPU tests, the decode bench (--extra --paged), then side by side the sample through `check`
  # (two processes) and racecheck + synccheck on the structural variants, then the model bench
  # with a host profile of our decode step.
  f=$OUT/decode15v4; mkdir -p "$f"; unpack_cubins; t0=$(date +%s)
  python3 -m autotune.cli compile --config @.prebuild.json --arch sm_90 --jobs 16 --quiet \
    > "$f/compile.txt" 2>&1; tail -n 1 "$f/compile.txt"; echo "compiled at $(( $(date +%s) - t0 )) s"
  timeout 150 python3 -m pytest tests/gpu/test_decode_gpu.py tests/gpu/test_decode_dispatch_gpu.py \
    -q -rfE > "$f/pytest_decode_gpu.txt" 2>&1; echo "pytest rc $? at $(( $(date +%s) - t0 )) s"
  timeout 200 python3 benchmarks/decode_bench.py --json "$f/decode_bench_h200.json" --extra --paged \
    > "$f/decode_bench_h200.txt" 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
  python3 - > /dev/null <<'PY'
import json
configs = json.load(open("benchmarks/configs/decode_v4_sample.json"))
half = (len(configs) + 1) // 2
json.dump(configs[:half], open("/tmp/sample_a.json", "w"))
json.dump(configs[half:], open("/tmp/sample_b.json", "w"))
PY
  for part in a b; do
    ( timeout 200 python3 -m autotune.cli check --config @/tmp/sample_$part.json --seed 25 --jobs 4 \
        --json "$f/decode_check_v4_sample_$part.json" --quiet > "$f/decode_check_v4_sample_$part.txt" 2>&1
      echo "rc=$? at $(( $(date +%s) - t0 )) s" >> "$f/decode_check_v4_sample_$part.txt" ) &
  done
  sanitize_variants benchmarks/configs/decode_structural_variants.json \
    "$f/decode_sanitizers_v4_h200.txt"; wait
  echo "check + sanitizers at $(( $(date +%s) - t0 )) s"
  timeout 120 python3 benchmarks/model_bench.py --json "$f/model_bench_h200.json" --host-profile 40 \
    > "$f/model_bench_h200.txt" 2>&1; echo "model bench rc $? at $(( $(date +%s) - t0 )) s"
  tail -n 3 "$f/pytest_decode_gpu.txt"; tail -n 50 "$f/decode_bench_h200.txt" | cut -c1-150
  grep -E "SUMMARY" "$f/decode_sanitizers_v4_h200.txt" | sort | uniq -c
  tail -n 2 "$f"/decode_check_v4_sample_*.txt; grep -A4 "^phase" "$f/model_bench_h200.txt"
  ;;
decode15probe)
  # Issue 15's open questions and issue 16's GPU evidence in one call (cubins carried in
  # .c90pack): where B=1 and paged decode calls spend their time (benchmarks/decode_probe.py),
  # the Hugging Face model bench and the SDPA drop-in's GPU matrix (issue 16), then, side by
  # side, racecheck + synccheck on the decode structural variants and every D=128 decode build
  # through `check` (benchmarks/configs/decode_d128_every_build.json, two processes) until UNTIL.
  f=$OUT/decode15probe; mkdir -p "$f"; unpack_cubins; t0=$(date +%s)
  left() { echo $(( ${UNTIL:-540} - ($(date +%s) - t0) )); }
  # PROBE=0 / MODEL=0 / DROPIN=0 / SANITIZE=0 / CHECK=0 leave a part out; BENCH=1 runs the
  # decode bench (--extra --paged) first.
  if [ "${BENCH:-0}" = 1 ]; then
    timeout "${BENCH_S:-260}" python3 benchmarks/decode_bench.py --json "$f/decode_bench_h200.json" \
      --extra --paged > "$f/decode_bench_h200.txt" 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
  fi
  if [ "${PROBE:-1}" = 1 ]; then
    timeout 150 python3 benchmarks/decode_probe.py --json "$f/decode_probe_h200.json" \
      > "$f/decode_probe_h200.txt" 2>&1; echo "probe rc $? at $(( $(date +%s) - t0 )) s"
  fi
  if [ "${MODEL:-1}" = 1 ]; then
    timeout 120 python3 benchmarks/model_bench.py --json "$f/model_bench_h200.json" \
      > "$f/model_bench_h200.txt" 2>&1; echo "model bench rc $? at $(( $(date +%s) - t0 )) s"
  fi
  if [ "${DROPIN:-1}" = 1 ]; then
    timeout 120 python3 -m pytest tests/gpu/test_sdpa_dropin_gpu.py tests/gpu/test_sdpa_dispatch.py \
      -q -rfE > "$f/pytest_sdpa_dropin_gpu.txt" 2>&1; echo "pytest rc $? at $(( $(date +%s) - t0 )) s"
  fi
  python3 - > /dev/null <<'PY'
import json
configs = json.load(open("benchmarks/configs/decode_d128_every_build.json"))
half = (len(configs) + 1) // 2
json.dump(configs[:half], open("/tmp/d128_a.json", "w"))
json.dump(configs[half:], open("/tmp/d128_b.json", "w"))
PY
  if [ "${CHECK:-1}" = 1 ]; then
    for part in a b; do
      ( timeout "$(( $(left) - 15 ))" python3 -m autotune.cli check --config @/tmp/d128_$part.json \
          --seed 24 --jobs 4 --json "$f/decode_check_d128_every_build_$part.json" --quiet \
          > "$f/decode_check_d128_every_build_$part.txt" 2>&1
        echo "rc=$? at $(( $(date +%s) - t0 )) s" >> "$f/decode_check_d128_every_build_$part.txt" ) &
    done
  fi
  if [ "${SANITIZE:-1}" = 1 ]; then
    sanitize_variants benchmarks/configs/decode_structural_variants.json \
      "$f/decode_sanitizers_h200.txt"; echo "sanitizers at $(( $(date +%s) - t0 )) s"
  fi
  wait
  tail -n 50 "$f/decode_bench_h200.txt" 2>/dev/null | cut -c1-160
  tail -n 14 "$f/decode_probe_h200.txt" 2>/dev/null | cut -c1-240
  tail -n 6 "$f/model_bench_h200.txt" 2>/dev/null; tail -n 4 "$f/pytest_sdpa_dropin_gpu.txt" 2>/dev/null
  grep -E "SUMMARY" "$f/decode_sanitizers_h200.txt" 2>/dev/null | sort | uniq -c
  tail -n 2 "$f"/decode_check_d128_every_build_*.txt
  ;;
decode15v3)
  # Issue 15, decode kernel v3 (cubins prebuilt and carried in .c90pack): the decode GPU tests,
  # the decode bench beside SDPA and a device copy (BENCH=0 skips it), then a piece of the
  # decode-tuning session (families decode; torch SDPA's backends in every re-ranking) into
  # .tuning/h200.db, carried between calls and returned in $OUT; with the time left (CHECK=1),
  # D=128 decode configs through `check` (KV-cache cases included) in a fixed order from
  # CHECK_FROM, so that calls continue each other. UNTIL: seconds for the whole stage.
  f=$OUT/decode15v3; mkdir -p "$f" .tuning; unpack_cubins; t0=$(date +%s)
  left() { echo $(( ${UNTIL:-540} - ($(date +%s) - t0) )); }
  # PREBUILD=1: the configs of .prebuild.json (carried) that no carried pack holds are built on
  # 12 of the host's cores beside the GPU work, and every decode cubin comes back in $OUT.
  if [ "${PREBUILD:-0}" = 1 ]; then
    (timeout "$(( ${UNTIL:-540} - 40 ))" nice -n 10 python3 -m autotune.cli compile \
       --config @.prebuild.json --arch sm_90 --jobs 12 --quiet > "$f/prebuild.txt" 2>&1 &)
  fi
  if [ "${TESTS:-1}" = 1 ]; then
    timeout 180 python3 -m pytest tests/gpu/test_decode_gpu.py tests/gpu/test_decode_dispatch_gpu.py \
      -v -rA > "$f/pytest_decode_gpu.txt" 2>&1; echo "pytest rc $? at $(( $(date +%s) - t0 )) s"
  fi
  if [ "${BENCH:-1}" = 1 ]; then
    timeout "${BENCH_S:-200}" python3 benchmarks/decode_bench.py --json "$f/decode_bench_h200.json" \
      --extra --paged > "$f/decode_bench_h200.txt" 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
  fi
  if [ "$(left)" -gt 60 ]; then
    python3 -m autotune.cli tune --shapes decode-tuning --family decode --trials "${TRIALS:-8}" \
      --rerank-top "${RERANK_TOP:-3}" --skip-tuned --stop-after "$(( $(left) - ${CHECK_S:-0} - 30 ))" \
      --db "sqlite:///$PWD/.tuning/h200.db" --json "$f/tune_piece_$t0.json" --quiet \
      > "$f/tune_piece_$t0.txt" 2>&1; echo "tune rc $? at $(( $(date +%s) - t0 )) s"
    copy_db .tuning/h200.db "$OUT/h200.db"
  fi
  if [ "${CHECK:-0}" = 1 ] && [ "$(left)" -gt 30 ]; then
    python3 - "${CHECK_FROM:-0}" > /tmp/check_configs.json <<'PY'
import json, sys
from autotune.model import load_space, target_for_arch
space = load_space("decode")
configs = space.valid_configs(target_for_arch(90), {"head_dim": 128, "num_splits": 1})
print(json.dumps([c.as_dict() for c in configs[int(sys.argv[1]):]]))
PY
    # `check` writes its JSON at the end: --limit keeps it inside the time left (about 1 s per
    # config with its cubin carried), the timeout only guards.
    timeout "$(( $(left) - 10 ))" python3 -m autotune.cli check --config @/tmp/check_configs.json \
      --limit "$(( ($(left) - 30) * 2 / 3 ))" --json "$f/decode_check_d128_from${CHECK_FROM:-0}.json" --quiet \
      > "$f/decode_check_d128_from${CHECK_FROM:-0}.txt" 2>&1; echo "check rc $? at $(( $(date +%s) - t0 )) s"
  fi
  if [ "${PREBUILD:-0}" = 1 ]; then
    tar czf "$OUT/decode_cubins.tgz" -C "$CUTE_AUTOTUNE_CACHE" cubins/decode
  fi
  tail -n 3 "$f/pytest_decode_gpu.txt" 2>/dev/null; grep -E "FAILED|ERROR" "$f/pytest_decode_gpu.txt" 2>/dev/null | head
  tail -n 44 "$f/decode_bench_h200.txt" 2>/dev/null | cut -c1-150; tail -n 6 "$f"/tune_piece_*.txt 2>/dev/null
  tail -n 2 "$f"/decode_check_*.txt 2>/dev/null
  ;;
decode15)
  # The decode family: its GPU tests, the bench beside SDPA and a device copy (WIDE=1: every
  # 16-row config at D=128 bf16), then while time is left a sample of its configs through
  # `check` (KV-cache cases included) and a short tuning session of one problem over the family
  # (split counts included). UNTIL: seconds for the whole stage.
  f=/tmp/decode15; mkdir -p "$f"; unpack_cubins; t0=$(date +%s)
  pack() { echo "$1 done at $(( $(date +%s) - t0 )) s"; tar czf "$OUT/decode15.tgz" -C /tmp decode15; }
  left() { echo $(( ${UNTIL:-540} - ($(date +%s) - t0) )); }
  # The decode tests, and the prefill families' dispatch tests (launcher ABI 3 under them).
  timeout 200 python3 -m pytest tests/gpu/test_decode_gpu.py tests/gpu/test_decode_dispatch_gpu.py \
    tests/gpu/test_sm90_dispatch_gpu.py tests/gpu/test_sm80_gpu.py \
    -v -rA > "$f/pytest_decode_gpu.txt" 2>&1; echo "pytest rc $?"; pack pytest
  timeout "${BENCH_S:-260}" python3 benchmarks/decode_bench.py --json "$f/decode_bench_h200.json" \
    --extra --paged ${WIDE:+--wide} > "$f/decode_bench_h200.txt" 2>&1; echo "bench rc $?"; pack bench
  if [ "$(left)" -gt 100 ]; then
    timeout "$(( $(left) - 70 ))" python3 -m autotune.cli check --family decode --head-dim 128 \
      --dtype bf16 --causal both --sample "${SAMPLE:-12}" --seed 15 \
      --json "$f/decode_check_sample.json" --quiet > "$f/decode_check_sample.txt" 2>&1
    echo "check rc $?"; pack check
  fi
  if [ "$(left)" -gt 50 ]; then
    db=sqlite:////tmp/decode_tune.db
    timeout "$(( $(left) - 10 ))" python3 -m autotune.cli tune --batch 1 --heads-q 64 \
      --heads-kv 8 --seqlen-q 1 --seqlen-k 8192 --head-dim 128 --dtype bf16 --family decode \
      --trials "${TRIALS:-24}" --time-budget "${TUNE_S:-60}" --db "$db" \
      --json "$f/decode_tune.json" > "$f/decode_tune.txt" 2>&1; echo "tune rc $?"
    python3 -m autotune.cli best --batch 1 --heads-q 64 --heads-kv 8 --seqlen-q 1 \
      --seqlen-k 8192 --head-dim 128 --dtype bf16 --db "$db" >> "$f/decode_tune.txt" 2>&1
    pack tune
  fi
  grep -E "PASSED|FAILED|ERROR" "$f/pytest_decode_gpu.txt" | grep -v "^PASSED" | cut -c1-120
  tail -n 3 "$f/pytest_decode_gpu.txt"; tail -n 45 "$f/decode_bench_h200.txt"
  tail -n 12 "$f/decode_tune.txt" 2>/dev/null; tail -n 2 "$f/decode_check_sample.txt" 2>/dev/null
  ;;
refactor)
  # The shipped configs compile first on all cores (the dispatch tests use them); each step packs
  # what is done so far into $OUT/refactor.tgz, so a timeout loses only the rest.
  f=/tmp/refactor; mkdir -p "$f"; unpack_cubins; t0=$(date +%s)
  pack() { echo "$1 done at $(( $(date +%s) - t0 )) s"; tar czf "$OUT/refactor.tgz" -C /tmp refactor; }
  python3 -c "import json
print(json.dumps([r['config'] for r in json.load(open('db/h200.json'))['results']
                  if r['family'] != 'sdpa']))" > /tmp/shipped.json
  python3 -m autotune.cli compile --config @/tmp/shipped.json --arch sm_90 --quiet \
    > "$f/compile_shipped.txt" 2>&1; tail -n 1 "$f/compile_shipped.txt"; pack compile
  CUTE_AUTOTUNE_GPU_SAMPLE=${SAMPLE:-4} CUTE_AUTOTUNE_EVIDENCE_DIR=$f/checks \
    timeout "${UNTIL:-330}" python3 -m pytest tests/faults tests/gpu -m gpu -v -rA \
    > "$f/pytest_gpu.txt" 2>&1; echo "pytest rc $?"; pack pytest
  timeout 90 python3 benchmarks/sweep.py --family sm80 --shapes 0 --limit 12 \
    --json "$f/sweep_smoke_sm80.json" > "$f/sweep_smoke_sm80.txt" 2>&1; echo "sweep rc $?"; pack sweep
  CUTE_AUTOTUNE_DB=sqlite:////tmp/demo.db timeout 150 python3 -m autotune.cli demo \
    > "$f/demo_h200.txt" 2>&1; echo "demo rc $?"; pack demo
  grep -E "^(FAILED|ERROR)" "$f/pytest_gpu.txt" | head -20; tail -n 1 "$f/pytest_gpu.txt"
  tail -n 4 "$f/sweep_smoke_sm80.txt"; tail -n 14 "$f/demo_h200.txt"
  ;;
final)
  # Each step packs what is done so far into $OUT/final.tgz, so a timeout loses only the rest.
  f=/tmp/final; mkdir -p "$f"; unpack_cubins
  t0=$(date +%s); db="sqlite:///$PWD/.tuning/h200.db"
  pack() { echo "$1 done at $(( $(date +%s) - t0 )) s"; tar czf "$OUT/final.tgz" -C /tmp final; }
  for set in llm-prefill untuned-probe; do
    stem=sm90_bench_${set//-/_}_h200
    timeout 200 python3 -m autotune.cli bench --shapes "$set" --db "$db" --json "$f/$stem.json" \
      --plot "$f/$stem.png" > "$f/$stem.txt" 2>&1; pack "$set"
  done
  # README command 1's job with an empty tuning database (the kernel cache is the carried one)
  CUTE_AUTOTUNE_DB=sqlite:////tmp/demo.db timeout 150 python3 -m autotune.cli demo \
    > "$f/demo_h200.txt" 2>&1; echo "demo rc $?"; pack demo
  timeout 150 python3 -m pytest tests/gpu -v -rA -k "not every_valid" > "$f/pytest_gpu.txt" 2>&1
  tail -n 1 "$f/pytest_gpu.txt"; pack pytest
  CUTE_AUTOTUNE_DB="$db" timeout 60 python3 benchmarks/host_overhead.py \
    --json "$f/host_overhead_sm90_h200.json" > "$f/host_overhead_sm90_h200.txt" 2>&1; pack overhead
  tail -n 4 "$f/host_overhead_sm90_h200.txt"; tail -n 16 "$f/demo_h200.txt"
  for set in llm_prefill untuned_probe; do tail -n 70 "$f/sm90_bench_${set}_h200.txt"; done
  ;;
v3)
  # A new sm90 kernel version before the whole space is re-validated: its structural variants
  # (sm90_variants.json, and sm90_v3_extra.json for head dims 32/256 and one-warpgroup tiles)
  # through the validator; the shipped best config of every llm-prefill problem timed in the
  # previous version (cubins carried in .c90pack/sm90_winners.tgz, OLD_HASH its source hash)
  # and in this one, beside SDPA (benchmarks/version_probe.py); racecheck and synccheck per
  # structural variant while time is left. Cubins of this version: .cubins90v3 (carried), the
  # rest compiled here on all cores.
  v=/tmp/v3; mkdir -p "$v"; t0=$(date +%s)
  export CUTE_AUTOTUNE_CACHE=$PWD/.cubins90v3
  variants=benchmarks/configs/sm90_variants.json; extra=benchmarks/configs/sm90_v3_extra.json
  shipped_configs > /tmp/winners.json
  python3 -m autotune.cli compile --family sm90 --config @$variants --config @$extra \
    --config @/tmp/winners.json --json "$v/v3_compile.json" --quiet > "$v/v3_compile.txt" 2>&1
  echo "compiled at $(( $(date +%s) - t0 )) s: $(tail -n 1 "$v/v3_compile.txt")"
  # PRECOMPILE="128 256": meanwhile, the whole space of these head dims compiled on the idle
  # cores (a 2-GPU host has 32) into /tmp/pre, packed into $OUT for the next calls to carry.
  precompile_start
  timeout 200 python3 -m autotune.cli check --config @$variants --config @$extra \
    --json "$v/sm90_v3_check_h200.json" --quiet > "$v/sm90_v3_check_h200.txt" 2>&1
  echo "checked at $(( $(date +%s) - t0 )) s"; tail -n 3 "$v/sm90_v3_check_h200.txt"
  mkdir -p /tmp/c90v2; tar xzf .c90pack/sm90_winners.tgz -C /tmp/c90v2
  timeout "${PROBE_S:-240}" python3 benchmarks/version_probe.py --old-cache /tmp/c90v2 \
    --old-hash "${OLD_HASH:?}" --stop-after $(( ${PROBE_S:-240} - 30 )) \
    --json "$v/v3_vs_v2_h200.json" > "$v/v3_vs_v2_h200.txt" 2>&1
  echo "probed at $(( $(date +%s) - t0 )) s"
  tar czf "$OUT/v3.tgz" -C /tmp v3
  for cfg in $(python3 -c "
import json
# the six switch combinations of the 128x128 D=128 tile, then the extra shapes (D=256, D=32,
# one warpgroup owning two 64-row atoms), fp16 causal
pick = [x for x in json.load(open('$variants')) if x['head_dim'] == 128 and x['dtype'] == 'fp16'
        and x['causal'] and x['block_m'] == 128 and x['block_n'] == 128 and x['kv_stages'] == 2]
pick += [x for x in json.load(open('$extra')) if x['dtype'] == 'fp16' and x['causal']]
print(' '.join(json.dumps(x, separators=(',', ':')) for x in pick))"); do
    [ $(( $(date +%s) - t0 )) -gt "${SANITIZE_UNTIL:-520}" ] && break
    for tool in racecheck synccheck; do
      echo "== $tool $cfg"
      timeout 40 compute-sanitizer --tool $tool python3 benchmarks/race_probe.py "$cfg" 2>&1 | tail -n 7
    done
  done > "$v/sm90_v3_sanitizers_h200.txt" 2>&1
  tar czf "$OUT/v3.tgz" -C /tmp v3
  precompile_pack
  grep -E "^==|ERROR SUMMARY|RACECHECK SUMMARY" "$v/sm90_v3_sanitizers_h200.txt" | tail -n 40
  tail -n 70 "$v/v3_vs_v2_h200.txt"
  ;;
v3final)
  # Kernel v3 dispatching the configs the v2 tuning chose (.tuning/h200.db carried: session 3's
  # merged database; the configs are rebuilt at v3). GPU 0: the tuned-dispatch bench over
  # llm-prefill, the GPU tests, untuned-probe while time is left. GPU 1: the validator over
  # every valid D=128 and D=256 config, then the D=64 configs prebuilt in .c90pack/check64.json.
  # Everything packs into $OUT/v3final.tgz after each step.
  f=/tmp/v3final; mkdir -p "$f"; t0=$(date +%s); db="sqlite:///$PWD/.tuning/h200.db"
  export CUTE_AUTOTUNE_CACHE=$PWD/.cubins90; unpack_cubins
  pack() { echo "$1 at $(( $(date +%s) - t0 )) s"; tar czf "$OUT/v3final.tgz" -C /tmp v3final; }
  shipped_configs > /tmp/winners.json
  python3 -m autotune.cli compile --family sm90 --config @/tmp/winners.json --quiet \
    > "$f/compile_winners.txt" 2>&1; tail -n 1 "$f/compile_winners.txt"; pack "winners compiled"
  (export CUDA_VISIBLE_DEVICES=1
   timeout $(( ${UNTIL:-430} - ($(date +%s) - t0) )) python3 -m autotune.cli check --family sm90 \
     --head-dim 128 256 --causal both --jobs 20 --json "$f/sm90_v3_check_d128_d256.json" --quiet \
     > "$f/sm90_v3_check_d128_d256.txt" 2>&1; pack "check d128/d256"
   timeout $(( ${UNTIL:-430} - ($(date +%s) - t0) )) python3 -m autotune.cli check \
     --config @.c90pack/check64.json --json "$f/sm90_v3_check_d64_part.json" --quiet \
     > "$f/sm90_v3_check_d64_part.txt" 2>&1; pack "check d64 part") &
  export CUDA_VISIBLE_DEVICES=0
  stem=sm90_bench_llm_prefill_h200
  timeout 260 python3 -m autotune.cli bench --shapes llm-prefill --db "$db" --json "$f/$stem.json" \
    --plot "$f/$stem.png" > "$f/$stem.txt" 2>&1; pack bench
  timeout 110 python3 -m pytest tests/gpu -v -rA -k "not every_valid" > "$f/pytest_gpu_session4.txt" 2>&1
  tail -n 1 "$f/pytest_gpu_session4.txt"; pack pytest
  left=$(( ${UNTIL:-430} - ($(date +%s) - t0) ))
  if [ "$left" -gt 60 ]; then
    stem=sm90_bench_untuned_probe_h200
    timeout "$left" python3 -m autotune.cli bench --shapes untuned-probe --db "$db" \
      --json "$f/$stem.json" --plot "$f/$stem.png" > "$f/$stem.txt" 2>&1; pack untuned-probe
  fi
  wait; pack all
  for x in "$f"/sm90_v3_check_*.txt; do echo "$x: $(tail -n 1 "$x")"; done
  tail -n 75 "$f/sm90_bench_llm_prefill_h200.txt"
  ;;
noregret)
  # Issue 13, part 1: every llm-prefill problem's finalists re-ranked beside torch SDPA's
  # backends in the one timing regime (no new search), llm-decode tuned with torch SDPA's
  # backends only (no decode kernel yet), the database exported; then the GPU tests of SDPA
  # dispatch. The database comes back in $OUT/h200.db for the next stage to carry (.tuning/).
  unpack_cubins; t0=$(date +%s); db="sqlite:////tmp/noregret/h200.db"; mkdir -p /tmp/noregret
  timeout ${RERANK_S:-330} python3 benchmarks/rerank_prefill.py --db "$db" \
    --json "$OUT/rerank_prefill_h200.json" > "$OUT/rerank_prefill_h200.txt" 2>&1
  echo "rerank rc $? at $(( $(date +%s) - t0 )) s"; tail -n 66 "$OUT/rerank_prefill_h200.txt"
  timeout 120 python3 -m autotune.cli tune --shapes llm-decode --family sdpa --db "$db" \
    --json "$OUT/tune_llm_decode_h200.json" --quiet > "$OUT/tune_llm_decode_h200.txt" 2>&1
  echo "decode rc $? at $(( $(date +%s) - t0 )) s"; tail -n 40 "$OUT/tune_llm_decode_h200.txt"
  copy_db /tmp/noregret/h200.db "$OUT/h200.db"
  python3 -m autotune.cli export --db "$db" > "$OUT/h200_export.json"
  timeout ${TESTS_S:-150} python3 -m pytest tests/gpu/test_sdpa_dispatch.py \
    tests/gpu/test_attention_gpu.py -v -rA > "$OUT/pytest_gpu_noregret.txt" 2>&1
  echo "tests at $(( $(date +%s) - t0 )) s"; tail -n 25 "$OUT/pytest_gpu_noregret.txt"
  ;;
agreement)
  # Issue 13, part 2: bench (the one regime, through attention() and F.sdpa) beside the plain
  # alternating-call check and the speed-ups stored in the database of `noregret` (carried
  # as .tuning/h200.db), per shape set (SETS, default both).
  unpack_cubins; db="sqlite:///$PWD/.tuning/h200.db"
  for set in ${SETS:-llm-prefill llm-decode}; do
    timeout ${AGREE_S:-400} python3 benchmarks/timing_agreement.py --db "$db" --shapes "$set" \
      --bench-json "$OUT/bench_no_regret_${set//-/_}_h200.json" \
      --agreement-json "$OUT/timing_agreement_${set//-/_}_h200.json" \
      > "$OUT/agreement_${set//-/_}_h200.txt" 2>&1
    echo "$set rc $?"; tail -n 70 "$OUT/agreement_${set//-/_}_h200.txt"
  done
  ;;
decode)
  # Issue 13, part 3 (after SDPA's backends got a direct switch instead of sdpa_kernel's
  # context manager): llm-decode re-tuned over SDPA's backends into the carried database, its
  # agreement and bench, the GPU tests of SDPA dispatch and the rest of tests/gpu (sub-spaces
  # left out). The database comes back in $OUT/h200.db.
  unpack_cubins; db="sqlite:///$PWD/.tuning/h200.db"; t0=$(date +%s)
  timeout 120 python3 -m autotune.cli tune --shapes llm-decode --family sdpa --db "$db" \
    --json "$OUT/tune_llm_decode_h200.json" --quiet > "$OUT/tune_llm_decode_h200.txt" 2>&1
  echo "decode rc $? at $(( $(date +%s) - t0 )) s"; tail -n 40 "$OUT/tune_llm_decode_h200.txt"
  copy_db .tuning/h200.db "$OUT/h200.db"
  python3 -m autotune.cli export --db "$db" > "$OUT/h200_export.json"
  timeout 150 python3 benchmarks/timing_agreement.py --db "$db" --shapes llm-decode \
    --bench-json "$OUT/bench_no_regret_llm_decode_h200.json" \
    --agreement-json "$OUT/timing_agreement_llm_decode_h200.json" \
    > "$OUT/agreement_llm_decode_h200.txt" 2>&1
  echo "agreement rc $? at $(( $(date +%s) - t0 )) s"; tail -n 40 "$OUT/agreement_llm_decode_h200.txt"
  timeout $(( ${UNTIL:-540} - ($(date +%s) - t0) )) python3 -m pytest tests/gpu tests/faults \
    -m gpu -k "not every_valid" -rA > "$OUT/pytest_gpu_decode.txt" 2>&1
  echo "tests at $(( $(date +%s) - t0 )) s"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest_gpu_decode.txt" | tail -n 25
  ;;
final13)
  # Issue 13, the evidence at the final timing regime (spin after each flush): llm-prefill's
  # finalists re-ranked beside SDPA into a fresh database seeded with db/h200.json,
  # llm-decode over SDPA's backends, bench beside the plain alternating-call check and the
  # stored speed-ups for both sets, the GPU tests of SDPA dispatch, the regret report.
  unpack_cubins; t0=$(date +%s); mkdir -p /tmp/final13; db="sqlite:////tmp/final13/h200.db"
  left() { echo $(( ${1} - ($(date +%s) - t0) )); }
  timeout $(left 215) python3 benchmarks/rerank_prefill.py --db "$db" \
    --json "$OUT/rerank_prefill_h200.json" > "$OUT/rerank_prefill_h200.txt" 2>&1
  echo "rerank rc $? at $(( $(date +%s) - t0 )) s"
  timeout $(left 285) python3 -m autotune.cli tune --shapes llm-decode --family sdpa --db "$db" \
    --json "$OUT/tune_llm_decode_h200.json" --quiet > "$OUT/tune_llm_decode_h200.txt" 2>&1
  echo "decode rc $? at $(( $(date +%s) - t0 )) s"
  copy_db /tmp/final13/h200.db "$OUT/h200.db"
  python3 -m autotune.cli export --db "$db" > "$OUT/h200_export.json"
  for set in llm-prefill llm-decode; do
    timeout $(left $([ $set = llm-prefill ] && echo 425 || echo 515)) \
      python3 benchmarks/timing_agreement.py --db "$db" --shapes "$set" \
      --bench-json "$OUT/bench_no_regret_${set//-/_}_h200.json" \
      --agreement-json "$OUT/timing_agreement_${set//-/_}_h200.json" \
      > "$OUT/agreement_${set//-/_}_h200.txt" 2>&1
    echo "$set rc $? at $(( $(date +%s) - t0 )) s"; tail -n 3 "$OUT/agreement_${set//-/_}_h200.txt"
  done
  timeout $(left 570) python3 -m pytest tests/gpu/test_sdpa_dispatch.py -rA \
    > "$OUT/pytest_gpu_sdpa_dispatch.txt" 2>&1
  echo "tests at $(( $(date +%s) - t0 )) s"; tail -n 1 "$OUT/pytest_gpu_sdpa_dispatch.txt"
  timeout $(left 590) python3 -m autotune.cli report --db "$db" --json "$OUT/report_h200.json" \
    > "$OUT/report_h200.txt" 2>&1; tail -n 5 "$OUT/report_h200.txt"
  ;;
decode90)
  # The decode90 family (issue 15), one call: what no carried pack holds compiled on all cores;
  # its GPU tests and the decode family's; then every decode90 build through `check` (PARTS
  # processes, each build at one of the split counts in turn) beside racecheck + synccheck on
  # its structural variants; then, alone on the GPU, with FLOOR=1 the B=1 floor probe
  # (decode_floor.py), and the decode bench of the problems with Lq >= MIN_LQ (both families
  # searched; --extra's too; PAGED=1: --paged).
  f=$OUT/decode90; mkdir -p "$f"; unpack_cubins; t0=$(date +%s)
  python3 -m autotune.cli compile --family decode90 --arch sm_90 --jobs 16 --quiet \
    > "$f/compile.txt" 2>&1; tail -n 1 "$f/compile.txt"
  [ -f .c90pack/prebuild.json ] && python3 -m autotune.cli compile --config @.c90pack/prebuild.json \
    --arch sm_90 --jobs 16 --quiet > "$f/compile_prebuild.txt" 2>&1
  echo "compiled at $(( $(date +%s) - t0 )) s"
  # TESTS=0: no GPU tests; TEST_FILES: which (TESTS once named both, and a list in it ran none).
  [ "${TESTS:-1}" = 1 ] && timeout "${TESTS_S:-200}" python3 -m pytest ${TEST_FILES:-tests/gpu/test_decode90_gpu.py \
    tests/gpu/test_decode_gpu.py tests/gpu/test_decode_dispatch_gpu.py} -q -rfE \
    > "$f/pytest_decode_gpu.txt" 2>&1
  echo "pytest rc $? at $(( $(date +%s) - t0 )) s"; tail -n 4 "$f/pytest_decode_gpu.txt"
  checking=()
  for d in 64 128; do
    python3 benchmarks/check_parts.py --family decode90 --head-dim $d --causal both \
      --splits 1 2 8 16 --parts "${PARTS:-2}" --out /tmp/part90_$d
    for part in $(seq 0 $(( ${PARTS:-2} - 1 ))); do
      ( timeout "${CHECK_S:-200}" python3 -m autotune.cli check --config @/tmp/part90_${d}_$part.json \
          --arch sm_90 --seed $(( 190 + part )) --jobs 2 --json "$f/check_d${d}_$part.json" \
          --quiet > "$f/check_d${d}_$part.txt" 2>&1
        echo "rc=$? at $(( $(date +%s) - t0 )) s" >> "$f/check_d${d}_$part.txt" ) &
      checking+=($!)
    done
  done
  sanitize_variants benchmarks/configs/decode90_structural_variants.json \
    "$f/decode90_sanitizers_h200.txt" 6 "${SAN_S:-150}"
  wait "${checking[@]}"
  python3 benchmarks/merge_checks.py "$f/check_decode90_h200.json" "$f"/check_d*_[0-9]*.json \
    --command "bash benchmarks/h200_evidence.sh decode90: per head dim D in 64 128, python3 benchmarks/check_parts.py --family decode90 --head-dim D --causal both --splits 1 2 8 16 --parts ${PARTS:-2} --out /tmp/part90_D, then per part N: python3 -m autotune.cli check --config @/tmp/part90_D_N.json --arch sm_90 --seed 190+N --jobs 2"
  tail -q -n 2 "$f"/check_d*_[0-9]*.txt; echo "check + sanitizers at $(( $(date +%s) - t0 )) s"
  grep -E "SUMMARY|Error" "$f/decode90_sanitizers_h200.txt" | sort | uniq -c
  if [ -n "${FLOOR:-}" ]; then
    timeout 60 python3 benchmarks/decode_floor.py --json "$f/decode_floor_h200.json" \
      > "$f/decode_floor_h200.txt" 2>&1; echo "floor rc $? at $(( $(date +%s) - t0 )) s"
    cat "$f/decode_floor_h200.txt"
  fi
  if [ "${BENCH:-1}" = 1 ]; then
    # SHAPES: a shape set or file (then without --extra); TAG names the output; FAMS the
    # families searched (default both).
    tag=${TAG:-lq${MIN_LQ:-4}plus}
    timeout $(( ${UNTIL:-560} - ($(date +%s) - t0) )) python3 benchmarks/decode_bench.py \
      --json "$f/decode_bench_${tag}_h200.json" --min-lq "${MIN_LQ:-4}" \
      ${SHAPES:+--shapes "$SHAPES"} $([ -z "${SHAPES:-}" ] && echo --extra) ${PAGED:+--paged} \
      ${FAMS:+--families "$FAMS"} \
      > "$f/decode_bench_${tag}_h200.txt" 2>&1
    echo "bench rc $? at $(( $(date +%s) - t0 )) s"
    tail -n 50 "$f/decode_bench_${tag}_h200.txt" | cut -c1-160
  fi
  tar czf "$OUT/decode90.tgz" -C "$OUT" decode90
  ;;
decodeb1)
  # Issue 15, decode90 with ctas_per_sm at B=1, one call: TESTS=1 decode90's GPU tests; NCU=1
  # Nsight Compute on the decode kernels of benchmarks/configs/decode_profiles.txt (one line a
  # kernel: B,Hq,Hkv,Lq,Lk | --causal or nothing | splits | tile JSON); FLUSH=1
  # benchmarks/flush_probe.py (the L2 flush by writing against one by reading); ALT=1 attention() from
  # db/h200.json against SDPA's default in the plain alternation on ALT_SHAPES (else SHAPES); then SHAPES tuned
  # with decode90 beside SDPA's backends (--skip-tuned, .tuning/h200.db carried between calls)
  # until UNTIL - 70 s.
  f=$OUT/decodeb1; mkdir -p "$f" .tuning; unpack_cubins; t0=$(date +%s)
  shapes=${SHAPES:-benchmarks/configs/decode_b1_retune.toml}
  if [ "${TESTS:-1}" = 1 ]; then
    timeout "${TESTS_S:-200}" python3 -m pytest -q -p no:cacheprovider -rfE \
      tests/gpu/test_decode90_gpu.py > "$f/pytest_decode90_gpu.txt" 2>&1
    echo "tests rc $? at $(( $(date +%s) - t0 )) s"; tail -n 3 "$f/pytest_decode90_gpu.txt"
  fi
  if [ "${NCU:-1}" = 1 ]; then
    n=0
    while IFS='|' read -r problem causal splits tile; do
      n=$(( n + 1 ))
      timeout 120 ncu --clock-control none -k regex:cute_autotune_fwd --launch-skip 3 \
        --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats python3 benchmarks/decode_profile.py --problem "$problem" \
        $causal --splits "$splits" "$tile" > "$f/ncu_$n.txt" 2>&1
      echo "ncu $n rc $? at $(( $(date +%s) - t0 )) s"
    done < benchmarks/configs/decode_profiles.txt
    grep -hE "calls$|DRAM Throughput|Duration|Achieved Occupancy|Block Limit (Registers|Shared)|Waves Per SM" \
      "$f"/ncu_*.txt | cut -c1-150
  fi
  if [ "${FLUSH:-0}" = 1 ]; then  # the L2 flush's write-back, against a flush by reading
    timeout 120 python3 benchmarks/flush_probe.py --json "$f/flush_probe_h200.json" \
      > "$f/flush_probe_h200.txt" 2>&1
    echo "flush probe rc $? at $(( $(date +%s) - t0 )) s"; cat "$f/flush_probe_h200.txt"
  fi
  if [ "${ALT:-0}" = 1 ]; then
    timeout 200 python3 benchmarks/alternating_check.py --db "sqlite:////tmp/alt.db" \
      --shapes "${ALT_SHAPES:-$shapes}" --spin-cycles 400000 --json "$f/alternating_b1.json" \
      > "$f/alternating_b1.txt" 2>&1
    echo "alternating rc $? at $(( $(date +%s) - t0 )) s"; cut -c1-150 "$f/alternating_b1.txt"
  fi
  left=$(( ${UNTIL:-540} - 70 - ($(date +%s) - t0) ))
  tune_decode90 "$shapes" "$left" "${TRIALS:-8}" "$f/tune_b1_$t0" 20
  copy_db .tuning/h200.db "$f/h200.db"
  tar czf "$OUT/decodeb1.tgz" -C "$OUT" decodeb1
  ;;
epilogue)
  # Issue 15, decode90's epilogue (the partial O swizzled in shared memory, the in-cluster
  # combine's loads issued an item ahead), one call: old and new kernels in turn
  # (old_and_new_kernels), then decode90's GPU tests beside racecheck and synccheck of its
  # structural variants (SANITIZE=1).
  c=$PWD/benchmarks/configs
  old_and_new_kernels "$OUT/epilogue" \
    --case 8,64,8,16 256,8192 "$c/decode90_epilogue_b8h64.json" \
    --case 8,32,8,16 8192 "$c/decode90_epilogue_b8h32.json" \
    --case 1,64,8,16 8192,32768 "$c/decode90_epilogue_b1h64.json"
  ;;
pair)
  # Issue 15, two splits in a cluster reduced by exchange (reduce_pair) instead of the pulled
  # combine, one call: old and new kernels in turn on `db/`'s two-split tiles of the B=8 GQA
  # rows and, unchanged by it, the combine entry, one split (`db/`'s B64 and B8 H128/8 tiles)
  # and 8 splits; then decode90's GPU tests beside racecheck and synccheck of its structural
  # variants (SANITIZE=1).
  c=$PWD/benchmarks/configs
  old_and_new_kernels "$OUT/pair" \
    --case 8,64,8,16 256,8192 "$c/decode90_b8h64_variants.json" \
    --case 8,32,8,16 256,8192 "$c/decode90_epilogue_b8h32.json" \
    --case 8,32,8,4 8192 "$c/decode90_pair_b8h32lq4.json" \
    --case 8,64,8,4 8192 "$c/decode90_pair_b8h64lq4.json" \
    --case 8,32,8,1 8192 "$c/decode90_pair_b8h32lq1.json" \
    --case 64,32,8,16 8192 "$c/decode90_pair_b64h32.json" \
    --case 8,128,8,16 8192 "$c/decode90_pair_b8h128.json" \
    --case 1,64,8,16 8192 "$c/decode90_epilogue_b1h64.json"
  ;;
paircode)
  # Issue 15, the exchange's code size (the fwd entry grew 54 -> 71 KB with it, 94 KB with the
  # exchange as its own instantiation of consume): TREES=".oldtree .treeB ." -- the previous
  # kernel, the exchange in its own instantiation, and this tree -- in turn on `db/`'s tiles
  # of B=8 rows at 2 splits and of B=1 rows at 8 and 16 splits (the combine entry).
  c=$PWD/benchmarks/configs
  old_and_new_kernels "$OUT/paircode" \
    --case 8,64,8,16 256,8192 "$c/decode90_b8h64_variants.json" \
    --case 8,32,8,16 256,8192 "$c/decode90_epilogue_b8h32.json" \
    --case 8,64,8,4 8192 "$c/decode90_pair_b8h64lq4.json" \
    --case 1,64,8,16 32768 "$c/decode90_pair_b1h64_entry.json" \
    --case 1,32,8,4 32768 "$c/decode90_pair_b1h32lq4_entry.json" \
    --case 1,32,8,1 8192 "$c/decode90_pair_b1h32lq1.json"
  ;;
b8retune)
  # Issue 15, one call: BOUND=1 benchmarks/decode_bound.py (what the timing rule lets any kernel
  # reach on the rows short of a target: the floor, a pure read and a copy of K and V, against
  # attention() and SDPA); TESTS=1 the GPU tests of the sm80 family, tuning, timing and decode
  # dispatch; then SHAPES tuned with decode90 beside SDPA's backends (--skip-tuned,
  # .tuning/h200.db carried between calls) until UNTIL - 40 s (- ALT_S with ALT=1); ALT=1
  # attention() from .tuning/h200.db (db/'s entries where it holds none) against SDPA
  # alternated on ALT_SHAPES (else SHAPES).
  f=$OUT/b8retune; mkdir -p "$f" .tuning; unpack_cubins; t0=$(date +%s)
  shapes=${SHAPES:-benchmarks/configs/decode_b8_retune.toml}
  if [ "${BOUND:-1}" = 1 ]; then
    timeout 150 python3 benchmarks/decode_bound.py --json "$f/decode_bound_h200.json" \
      > "$f/decode_bound_h200.txt" 2>&1
    echo "bound rc $? at $(( $(date +%s) - t0 )) s"; cut -c1-160 "$f/decode_bound_h200.txt"
  fi
  if [ "${TESTS:-1}" = 1 ]; then
    timeout "${TESTS_S:-200}" python3 -m pytest -q -p no:cacheprovider -rfE --durations=8 \
      tests/gpu/test_sm80_gpu.py tests/gpu/test_tuning_gpu.py tests/gpu/test_timing_gpu.py \
      tests/gpu/test_decode_dispatch_gpu.py > "$f/pytest_gpu.txt" 2>&1
    echo "tests rc $? at $(( $(date +%s) - t0 )) s"; tail -n 3 "$f/pytest_gpu.txt"
  fi
  alt_s=0; [ "${ALT:-0}" = 1 ] && alt_s=${ALT_S:-200}
  left=$(( ${UNTIL:-540} - 40 - alt_s - ($(date +%s) - t0) ))
  tune_decode90 "$shapes" "$left" "${TRIALS:-10}" "$f/tune_$t0" 24
  if [ "${ALT:-0}" = 1 ]; then  # on a copy: dispatch fills it with db/'s other problems
    copy_db .tuning/h200.db /tmp/alt.db
    timeout "$alt_s" python3 benchmarks/alternating_check.py --db "sqlite:////tmp/alt.db" \
      --shapes "${ALT_SHAPES:-$shapes}" --spin-cycles 400000 --json "$f/alternating.json" \
      > "$f/alternating.txt" 2>&1
    echo "alternating rc $? at $(( $(date +%s) - t0 )) s"; cut -c1-150 "$f/alternating.txt"
  fi
  copy_db .tuning/h200.db "$f/h200.db"
  ;;
decodekv)
  # Issue 15, decode90 reading KV caches, one call: BENCH=1 the whole decode bench (both families searched on
  # every row, paged and per-sequence-length rows included); then decode-tuning's cache-kind
  # problems (KINDS) and, with DENSE1=1, its dense Lq=1 problems, searched with the decode and
  # decode90 families beside SDPA's backends (the decode family's bf16 D=128 space compiled on
  # idle cores meanwhile) (--skip-tuned: each problem once over calls), each
  # piece started until UNTIL - 70 s (.tuning carried and returned; one tarball).
  f=$OUT/decodekv; mkdir -p "$f" .tuning; unpack_cubins; t0=$(date +%s)
  python3 -m autotune.cli compile --family decode90 --arch sm_90 --jobs 16 --quiet \
    > "$f/compile_decode90.txt" 2>&1; tail -n 1 "$f/compile_decode90.txt"
  if [ "${BENCH:-1}" = 1 ]; then
    timeout "${BENCH_S:-300}" python3 benchmarks/decode_bench.py --json "$f/decode_bench_h200.json" \
      --min-lq 1 --extra --paged > "$f/decode_bench_h200.txt" 2>&1
    echo "bench rc $? at $(( $(date +%s) - t0 )) s"
  fi
  # (after the bench, whose timing a busy host could disturb; only when the decode family is tuned)
  case ",${FAMILIES:-decode,decode90}," in *,decode,*)
    (nice -n 10 python3 -m autotune.cli compile --family decode --head-dim 128 --dtype bf16 \
       --causal both --arch sm_90 --jobs 12 --quiet > "$f/compile_decode.txt" 2>&1 &) ;; esac
  tune_piece() {  # tune_piece NAME ARGS...: one tuning piece if time is left
    local name=$1 left; shift; left=$(( ${UNTIL:-540} - 70 - ($(date +%s) - t0) ))
    [ "$left" -gt 20 ] || { echo "tune $name not started"; return 0; }
    python3 -m autotune.cli tune --shapes decode-tuning "$@" --family "${FAMILIES:-decode,decode90}" \
      --trials "${TRIALS:-8}" --rerank-top "${RERANK_TOP:-3}" --skip-tuned --stop-after "$left" \
      --db "sqlite:///$PWD/.tuning/h200.db" --json "$f/tune_$name.json" --quiet \
      > "$f/tune_$name.txt" 2>&1
    echo "tune $name rc $? at $(( $(date +%s) - t0 )) s"; }
  for kind in ${KINDS:-seqlens paged16 paged64}; do
    tune_piece "$kind" --causal "${CAUSAL:-both}" --kv-cache "$kind"; done
  [ "${DENSE1:-0}" = 1 ] && tune_piece dense_lq1 --causal false --kv-cache dense
  copy_db .tuning/h200.db "$f/h200.db"
  [ "${BENCH:-1}" = 1 ] && tail -n 48 "$f/decode_bench_h200.txt" | cut -c1-160
  tail -q -n 8 "$f"/tune_*.txt | cut -c1-160
  tar czf "$OUT/decodekv.tgz" -C "$OUT" decodekv
  ;;
hostlq1)
  f=$OUT/hostlq1; mkdir -p "$f" .tuning /tmp/old; unpack_cubins; t0=$(date +%s)
  if [ "${OLD:-1}" = 1 ]; then
    tar xzf .c90pack/old_tree.tgz -C /tmp/old
    PYTHONPATH=/tmp/site:/tmp/old timeout 150 python3 benchmarks/host_overhead.py --decode \
      --calls 1000 --rounds 5 --json "$f/host_decode_old.json" > "$f/host_decode_old.txt" 2>&1
    echo "old rc $? at $(( $(date +%s) - t0 )) s"
  fi
  if [ "${HOST:-1}" = 1 ]; then
    timeout 150 python3 benchmarks/host_overhead.py --decode --calls 1000 --rounds 5 \
      --json "$f/host_decode_new.json" > "$f/host_decode_new.txt" 2>&1
    echo "new rc $? at $(( $(date +%s) - t0 )) s"
  fi
  if [ "${TESTS:-1}" = 1 ]; then
    timeout "${TESTS_S:-200}" python3 -m pytest -q -p no:cacheprovider tests/gpu/test_decode_gpu.py \
      tests/gpu/test_decode90_gpu.py tests/gpu/test_timing_gpu.py > "$f/pytest_decode.txt" 2>&1
    echo "tests rc $? at $(( $(date +%s) - t0 )) s"
  fi
  if [ "${ALT:-0}" = 1 ]; then  # attention() from db/h200.json against SDPA, plainly alternated
    timeout 150 python3 benchmarks/alternating_check.py --db "sqlite:////tmp/alt.db" \
      --shapes benchmarks/configs/decode_lq1_retune.toml --spin-cycles 400000 \
      --json "$f/alternating_lq1.json" > "$f/alternating_lq1.txt" 2>&1
    echo "alternating rc $? at $(( $(date +%s) - t0 )) s"; cut -c1-150 "$f/alternating_lq1.txt"
  fi
  left=$(( ${UNTIL:-540} - 70 - ($(date +%s) - t0) ))
  if [ "$left" -gt 40 ]; then
    python3 -m autotune.cli tune --shapes benchmarks/configs/decode_lq1_retune.toml \
      --family decode90 --trials "${TRIALS:-8}" --rerank-top 3 --skip-tuned --stop-after "$left" \
      --db "sqlite:///$PWD/.tuning/h200.db" --json "$f/tune_lq1_$t0.json" --quiet \
      > "$f/tune_lq1_$t0.txt" 2>&1; echo "tune rc $? at $(( $(date +%s) - t0 )) s"
  fi
  copy_db .tuning/h200.db "$f/h200.db"
  grep -E "issue|Lk" "$f"/host_decode_*.txt 2>/dev/null | cut -c1-120
  tail -n 3 "$f/pytest_decode.txt" 2>/dev/null
  tail -n 20 "$f"/tune_lq1_*.txt 2>/dev/null | cut -c1-160
  tar czf "$OUT/hostlq1.tgz" -C "$OUT" hostlq1
  ;;
decode90tune)
  # Issue 15 with decode90, one call: BENCH=1 runs the decode bench of every problem (both
  # families, --extra --paged) and benchmarks/decode_floor.py first; then a piece of
  # decode-tuning's dense causal problems (Lq 4 and 16; CAUSAL=false: the Lq=1 ones) searched
  # with the decode and decode90 families beside SDPA's backends (--skip-tuned: the decode
  # studies already complete are kept, their finalists re-ranked with decode90's), started
  # until UNTIL - 70 s.
  f=$OUT/decode90tune; mkdir -p "$f" .tuning; unpack_cubins; t0=$(date +%s)
  [ -f .c90pack/prebuild.json ] && python3 -m autotune.cli compile --config @.c90pack/prebuild.json \
    --arch sm_90 --jobs 16 --quiet > "$f/compile_prebuild.txt" 2>&1
  echo "compiled at $(( $(date +%s) - t0 )) s"
  if [ "${BENCH:-1}" = 1 ]; then
    timeout "${BENCH_S:-260}" python3 benchmarks/decode_bench.py --json "$f/decode_bench_h200.json" \
      --extra --paged > "$f/decode_bench_h200.txt" 2>&1; echo "bench rc $? at $(( $(date +%s) - t0 )) s"
    timeout 90 python3 benchmarks/decode_floor.py --json "$f/decode_floor_h200.json" \
      > "$f/decode_floor_h200.txt" 2>&1; echo "floor rc $? at $(( $(date +%s) - t0 )) s"
  fi
  python3 -m autotune.cli tune --shapes decode-tuning --causal "${CAUSAL:-true}" --kv-cache dense \
    --family decode,decode90 --trials "${TRIALS:-8}" --rerank-top "${RERANK_TOP:-3}" --skip-tuned \
    --stop-after $(( ${UNTIL:-540} - 70 - ($(date +%s) - t0) )) --db "sqlite:///$PWD/.tuning/h200.db" \
    --json "$f/tune_piece_$t0.json" --quiet > "$f/tune_piece_$t0.txt" 2>&1
  echo "tune rc $? at $(( $(date +%s) - t0 )) s"
  copy_db .tuning/h200.db "$f/h200.db"
  [ "${BENCH:-1}" = 1 ] && { tail -n 48 "$f/decode_bench_h200.txt" | cut -c1-150; cat "$f/decode_floor_h200.txt"; }
  tail -n 25 "$f/tune_piece_$t0.txt" | cut -c1-160
  tar czf "$OUT/decode90tune.tgz" -C "$OUT" decode90tune
  ;;
record16)
  # Issue 16 item 3: the recordings `--replay` serves, one per family in REC (decode, sm90,
  # sm80; in turn), every valid config of the family on each picked problem. Cubins carried in
  # .c90pack (prebuilt off the GPU host); what is missing is compiled on all cores, the next
  # family's while this one's sweep runs (nice). Every build of a piece goes through `check`
  # first, PARTS processes side by side (for the decode family: its whole bf16 D=128 space at
  # this kernel version through the validator); benchmarks/sweep.py then times every config,
  # taking those validations (--verdicts), and writes after each problem, so UNTIL cuts it
  # between problems. PICK_<family> overrides the picked problems (indices into the set).
  # CHECK=0 takes the validations of an earlier call's check files, carried in .rec_verdicts/.
  # ROUND_MS / WARMUP_MS: the sweep's timing (each problem of a recording records its own).
  f=/tmp/record16; mkdir -p "$f"; unpack_cubins; t0=$(date +%s); shopt -s nullglob
  [ "${CHECK:-1}" = 0 ] && [ -d .rec_verdicts ] && cp .rec_verdicts/check_*_[0-9]*.json "$f"/
  piece_of() {  # the space piece and the sweep's problems of family $1
    case "$1" in
      decode) piece=(--family decode --head-dim 128 --dtype bf16 --causal both)
              sweep=(--shape-set llm-decode --head-dim 128 --dtype bf16
                     --pick ${PICK_decode:-0 4 6 9 16 20 25 27}) ;;
      sm90|sm80) piece=(--family "$1" --head-dim 128 --dtype fp16 --causal false)
                 sweep=(--shape-set llm-prefill --head-dim 128 --dtype fp16 --causal false) ;;
      *) echo "REC: decode, sm90 or sm80, not $1"; exit 2 ;;
    esac; }
  compile_piece() { piece_of "$1"; nice -n "$2" python3 -m autotune.cli compile "${piece[@]}" \
    --arch sm_90 --jobs 16 --quiet > "$f/compile_$1.txt" 2>&1; }
  # ALSO_CHECK="--family decode --head-dim 128 --dtype fp16": another piece of a space through
  # check (4 processes) beside the first family's check, for the validation record only.
  checking=()  # the check processes: the GPU is theirs until they end, then the sweep's
  if [ -n "${ALSO_CHECK:-}" ]; then
    python3 -m autotune.cli compile $ALSO_CHECK --arch sm_90 --jobs 16 --quiet > "$f/compile_also.txt" 2>&1
    python3 benchmarks/check_parts.py $ALSO_CHECK --parts 4 --out /tmp/part_also
    for part in 0 1 2 3; do
      ( timeout "${CHECK_S:-240}" python3 -m autotune.cli check --config @/tmp/part_also_$part.json \
          --arch sm_90 --seed $(( 170 + part )) --jobs 2 --json "$f/check_also_$part.json" \
          --quiet > "$f/check_also_$part.txt" 2>&1
        echo "rc=$? at $(( $(date +%s) - t0 )) s" >> "$f/check_also_$part.txt" ) &
      checking+=($!)
    done
  fi
  set -- ${REC:-}  # none: ALSO_CHECK alone
  if [ $# -gt 0 ]; then
    compile_piece "$1" 0; tail -n 1 "$f/compile_$1.txt"; echo "compiled $1 at $(( $(date +%s) - t0 )) s"
  fi
  while [ $# -gt 0 ]; do
    rec=$1; shift; piece_of "$rec"
    [ $# -gt 0 ] && { compile_piece "$1" 10 & }
    if [ "${CHECK:-1}" = 1 ]; then
      python3 benchmarks/check_parts.py "${piece[@]}" --parts "${PARTS:-4}" --out /tmp/part_$rec
      for part in $(seq 0 $(( ${PARTS:-4} - 1 ))); do
        ( timeout "${CHECK_S:-240}" python3 -m autotune.cli check --config @/tmp/part_${rec}_$part.json \
            --arch sm_90 --seed $(( 160 + part )) --jobs 2 --json "$f/check_${rec}_$part.json" \
            --quiet > "$f/check_${rec}_$part.txt" 2>&1
          echo "rc=$? at $(( $(date +%s) - t0 )) s" >> "$f/check_${rec}_$part.txt" ) &
        checking+=($!)
      done
    fi
    [ ${#checking[@]} -gt 0 ] && wait "${checking[@]}"; checking=()
    if [ "${CHECK:-1}" = 1 ]; then
      python3 benchmarks/merge_checks.py "$f/check_${rec}_h200.json" "$f"/check_${rec}_[0-9]*.json \
        --command "REC=$rec bash benchmarks/h200_evidence.sh record16: python3 benchmarks/check_parts.py ${piece[*]} --parts ${PARTS:-4} --out /tmp/part_$rec, then per part N: python3 -m autotune.cli check --config @/tmp/part_${rec}_N.json --arch sm_90 --seed 160+N --jobs 2"
      tail -q -n 3 "$f"/check_${rec}_[0-9]*.txt; echo "checked $rec at $(( $(date +%s) - t0 )) s"
    fi
    timeout $(( ${UNTIL:-560} - ($(date +%s) - t0) )) python3 benchmarks/sweep.py --family "$rec" \
      "${sweep[@]}" --rounds 3 --round-ms "${ROUND_MS:-5}" --warmup-ms "${WARMUP_MS:-20}" --verdicts "$f"/check_${rec}_[0-9]*.json \
      --json "$f/sweep_${rec}_h200.json.gz" > "$f/sweep_$rec.txt" 2>&1
    echo "sweep $rec rc $? at $(( $(date +%s) - t0 )) s"; cut -c1-220 "$f/sweep_$rec.txt"
    wait  # the next family's compile
  done
  if [ -n "${ALSO_CHECK:-}" ]; then
    [ ${#checking[@]} -gt 0 ] && wait "${checking[@]}"
    tail -q -n 3 "$f"/check_also_[0-9]*.txt; echo "checked at $(( $(date +%s) - t0 )) s"
    python3 benchmarks/merge_checks.py "$f/check_also_h200.json" "$f"/check_also_[0-9]*.json \
      --command "ALSO_CHECK='$ALSO_CHECK' bash benchmarks/h200_evidence.sh record16: python3 benchmarks/check_parts.py $ALSO_CHECK --parts 4 --out /tmp/part_also, then per part N: python3 -m autotune.cli check --config @/tmp/part_also_N.json --arch sm_90 --seed 170+N --jobs 2"
  fi
  tar czf "$OUT/record16.tgz" -C /tmp record16
  ;;
workers)
  # Issue 17 on the GPU, one call: three llm-prefill items (sm90, D=128, fp16, non-causal;
  # TRIALS and RERANK_TOP the same for both runs) enqueued into a fresh SQLite database and
  # drained by `cute-autotune worker --gpu 0`, which is killed by SIGKILL mid-item (polled:
  # KILL_AFTER search measurements of the running item) and restarted once its lease ran out;
  # a plain `cute-autotune tune` of the same items into another fresh database; the winners
  # of both re-timed together, A B A B with the L2 flushed before each call
  # (benchmarks/worker_run.py). What .c90pack lacks of the space is compiled first, on all
  # cores, for at most COMPILE_S. REPLAY=<recording>: the dry run, no GPU, nothing re-timed.
  f=/tmp/workers; rm -rf "$f"; mkdir -p "$f"; unpack_cubins; t0=$(date +%s)
  timeout "${COMPILE_S:-90}" python3 -m autotune.cli compile --family sm90 --head-dim 128 \
    --dtype fp16 --causal false --arch sm_90 --jobs 16 --quiet > "$f/compile.txt" 2>&1
  echo "compile rc $? at $(( $(date +%s) - t0 )) s: $(tail -n 1 "$f/compile.txt")"
  timeout $(( ${UNTIL:-450} - ($(date +%s) - t0) )) python3 benchmarks/worker_run.py --out "$f" \
    --trials "${TRIALS:-8}" --rerank-top "${RERANK_TOP:-2}" --kill-after "${KILL_AFTER:-3}" \
    --until $(( ${UNTIL:-450} - 15 - ($(date +%s) - t0) )) ${REPLAY:+--replay "$REPLAY"} \
    --command "TRIALS=${TRIALS:-8} RERANK_TOP=${RERANK_TOP:-2} KILL_AFTER=${KILL_AFTER:-3} bash benchmarks/h200_evidence.sh workers: python3 benchmarks/worker_run.py --trials ${TRIALS:-8} --rerank-top ${RERANK_TOP:-2} --kill-after ${KILL_AFTER:-3}${REPLAY:+ --replay $REPLAY}" \
    > "$f/worker_run.txt" 2>&1
  echo "worker_run rc $? at $(( $(date +%s) - t0 )) s"
  cp "$f/worker_kill_restart.json" "$OUT/" 2>/dev/null
  tar czf "$OUT/workers.tgz" -C /tmp workers; tail -n 12 "$f/worker_run.txt" | cut -c1-220
  ;;
scaleout)
  # Issue 18 item 1 on two GPUs, one call: llm-prefill's eight sm90 D=128 fp16 non-causal
  # items (TRIALS each, --no-reuse, fresh SQLite databases) drained by `worker --gpu 0`, then
  # by `worker --gpus all`, one of whose two workers is killed by SIGKILL in its last item
  # after KILL_AFTER search measurements and the item finished by the other after the LEASE
  # ran out; trials/min of both runs (benchmarks/scale_out.py; speedup >= 1.8 wanted), the
  # winners of both re-timed together on GPU 0. Every cubin is in .c90pack; `compile` only
  # checks the cache is whole before anything is timed. REPLAY=<recording>: the CPU dry run.
  # About 7 minutes on H200s (issue 17's run: ~24 s an item of 24 trials, ~14 s a worker's
  # start): one worker ~3.5 min, two ~2 min, the re-timing ~30 s.
  f=/tmp/scaleout; rm -rf "$f"; mkdir -p "$f"; unpack_cubins; t0=$(date +%s)
  [ -n "${REPLAY:-}" ] || nvidia-smi -L > "$f/gpus.txt" 2>&1
  timeout "${COMPILE_S:-90}" python3 -m autotune.cli compile --family sm90 --head-dim 128 \
    --dtype fp16 --causal false --arch sm_90 --jobs 16 --quiet > "$f/compile.txt" 2>&1
  echo "compile rc $? at $(( $(date +%s) - t0 )) s: $(tail -n 1 "$f/compile.txt")"
  args="--trials ${TRIALS:-24} --kill-after ${KILL_AFTER:-20} --lease ${LEASE:-6}"
  timeout $(( ${UNTIL:-500} - ($(date +%s) - t0) )) python3 benchmarks/scale_out.py \
    --out "$f" $args --until $(( ${UNTIL:-500} - 15 - ($(date +%s) - t0) )) \
    ${REPLAY:+--replay "$REPLAY"} --command "TRIALS=${TRIALS:-24} KILL_AFTER=${KILL_AFTER:-20} LEASE=${LEASE:-6}${REPLAY:+ REPLAY=$REPLAY} bash benchmarks/h200_evidence.sh scaleout: python3 benchmarks/scale_out.py $args${REPLAY:+ --replay $REPLAY}" \
    > "$f/scale_out.txt" 2>&1
  echo "scale_out rc $? at $(( $(date +%s) - t0 )) s"
  cp "$f/scale_out_2gpu_h200.json" "$OUT/" 2>/dev/null
  tar czf "$OUT/scaleout.tgz" -C /tmp scaleout; tail -n 20 "$f/scale_out.txt" | cut -c1-220
  ;;
*) echo "unknown stage $1"; exit 2 ;;
esac
