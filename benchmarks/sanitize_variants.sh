# Sourced by h200_evidence.sh and revalidate.sh (GPU host, repository root).
# sanitize_variants LIST OUT [PARALLEL] [TIMEOUT]: racecheck + synccheck (compute-sanitizer,
# benchmarks/race_probe.py) on each config of the JSON list LIST, PARALLEL processes at a time
# (default 7: each is mostly host-bound), each run cut at TIMEOUT seconds (default 200); every
# report's tail into OUT.
sanitize_variants() { local n
  python3 -c "import json, sys
for c in json.load(open(sys.argv[1])):
    print(json.dumps(c, separators=(',', ':')))" "$1" > /tmp/variants.txt
  export SANITIZE_TIMEOUT=${4:-200}
  run_one() { local tool=$1 n=$2 cfg; cfg=$(sed -n "${n}p" /tmp/variants.txt)
    { echo "== $tool $cfg"; timeout "$SANITIZE_TIMEOUT" compute-sanitizer --tool "$tool" python3 \
        benchmarks/race_probe.py "$cfg" 2>&1 | tail -n 7; } > "/tmp/san_${n}_$tool.txt"; }
  export -f run_one
  rm -f /tmp/san_*.txt
  n=$(wc -l < /tmp/variants.txt)
  for i in $(seq 1 "$n"); do echo "racecheck $i"; echo "synccheck $i"; done \
    | xargs -P "${3:-7}" -L 1 bash -c 'run_one "$0" "$1"'
  cat /tmp/san_*.txt > "$2"; }
