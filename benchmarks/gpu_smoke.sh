#!/usr/bin/env bash
# First look on the GPU host: environment, the smoke configs through `check`, a throughput probe
# against SDPA, and racecheck on a single-buffer and a ring-buffer config.
#   bash benchmarks/gpu_smoke.sh        (repo root on the GPU host; $OUT collects the results)
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 CUTE_AUTOTUNE_CACHE=$PWD/.cubins
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv
nvcc --version | tail -2
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
python3 -m autotune.cli check --config @benchmarks/configs/smoke.json --json "$OUT/smoke_check.json" --quiet 2>&1 | tee "$OUT/smoke_check.txt"
python3 benchmarks/sm80_throughput.py --check-json "$OUT/smoke_check.json" --json "$OUT/smoke_throughput.json" --top 2 2>&1 | tee "$OUT/smoke_throughput.txt"
for cfg in "$(python3 -c 'import json;print(json.dumps(json.load(open("benchmarks/configs/smoke.json"))[1]))')" \
           "$(python3 -c 'import json;print(json.dumps(json.load(open("benchmarks/configs/smoke.json"))[2]))')"; do
  timeout 240 compute-sanitizer --tool racecheck --racecheck-report all python3 benchmarks/race_probe.py "$cfg" 2>&1 | tail -8
done 2>&1 | tee "$OUT/smoke_racecheck.txt"
