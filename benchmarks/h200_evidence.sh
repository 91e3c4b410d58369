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
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUTE_AUTOTUNE_CACHE=$PWD/.cubins
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
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
  checks=$(ls /tmp/checks_tests*/*.json benchmarks/results/h200/check_tests*.json 2>/dev/null)
  python3 benchmarks/sweep.py --shapes 3 4 6 --json "$OUT/sweep_d64.json" 2>&1 | tail -4
  python3 benchmarks/sm80_throughput.py --head-dims 64 --check-json $checks --json "$OUT/throughput_d64.json" 2>&1 | tail -14
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
  # One piece (< 10 min) of the llm-prefill session; the database travels in .tuning/ (carried)
  # and comes back in $OUT, so the next piece resumes it.
  mkdir -p .tuning; piece=$(date +%s)
  python3 -m autotune.cli tune --shapes llm-prefill --trials "${TRIALS:-16}" --skip-tuned \
    --stop-after "${STOP_AFTER:-420}" --db "sqlite:///$PWD/.tuning/h200.db" \
    --json "$OUT/tune_piece_$piece.json" --quiet 2>&1 | tail -80 | tee "$OUT/tune_piece_$piece.txt"
  cp .tuning/h200.db "$OUT/h200.db"
  ;;
*) echo "unknown stage $1"; exit 2 ;;
esac
