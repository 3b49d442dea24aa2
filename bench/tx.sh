#!/usr/bin/env bash
# What the transaction holds cost (issue #12): two uzfs builds, before and
# after, interleaved (A B A B ...), on the same disk: small-file creates by
# 1, 2 and 4 concurrent processes (N files in all), a 1 MiB sequential write
# with an end fsync, and 16 KiB buffered random writes. Prints per-run
# figures and medians with their spread; also the daemon's CPU seconds and
# peak RSS per run.
#
# usage: bench/tx.sh BEFORE_BIN AFTER_BIN [ROUNDS]
#   BEFORE_BIN, AFTER_BIN: uzfs binaries (e.g. a worktree's target/release/uzfs)
# env: DATA [/var/tmp/uzfs-txbench]  FILES [12000]  SEQ [1G]  RUNTIME [10]
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: bench/tx.sh BEFORE_BIN AFTER_BIN [ROUNDS]" >&2; exit 2; }
BIN_A=$(realpath "$1"); BIN_B=$(realpath "$2"); ROUNDS=${3:-3}
DATA=${DATA:-/var/tmp/uzfs-txbench}; FILES=${FILES:-12000}; SEQ=${SEQ:-1G}; RUNTIME=${RUNTIME:-10}
LIB=$(pwd)/bench/fslib.py
OUT="$DATA/results.tsv"
mkdir -p "$DATA"; : > "$OUT"

one() { # label binary round
  local label=$1 U=$2 r=$3
  export UZFS_RUNDIR="$DATA/run-$label"
  rm -rf "$DATA/pool" "$UZFS_RUNDIR"; mkdir -p "$DATA/pool"
  truncate -s 8G "$DATA/pool/d0" "$DATA/pool/d1"
  local M="$DATA/mnt"
  "$U" zpool create -f -m "$M" txb mirror "$DATA/pool/d0" "$DATA/pool/d1" >/dev/null
  local PID; PID=$(cat "$UZFS_RUNDIR/uzfsd.pid")
  for p in 1 2 4; do
    mkdir -p "$M/c$p"
    local t0 t1; t0=$(date +%s.%N)
    for i in $(seq 1 $p); do python3 "$LIB" create "$M/c$p/p$i" $((FILES / p)) >/dev/null & done
    wait
    "$U" zpool sync txb
    t1=$(date +%s.%N)
    printf '%s\t%s\tcreate_p%s_files_per_s\t%.0f\n' "$label" "$r" "$p" "$(echo "$FILES / ($t1 - $t0)" | bc -l)" >> "$OUT"
  done
  fio --name=seq --ioengine=psync --direct=0 --rw=write --bs=1M --size="$SEQ" --end_fsync=1 \
      --filename="$M/seq" --output-format=json > "$DATA/seq.json"
  python3 -c "import json,sys; j=json.load(open('$DATA/seq.json')); print('%s\t%s\tseq_write_MiB_s\t%.0f' % ('$label', '$r', j['jobs'][0]['write']['bw']/1024))" >> "$OUT"
  fio --name=rw16 --ioengine=psync --direct=0 --rw=randwrite --bs=16k --size=1G --time_based \
      --runtime="$RUNTIME" --filename="$M/rw16" --output-format=json > "$DATA/rw.json"
  python3 -c "import json,sys; j=json.load(open('$DATA/rw.json')); print('%s\t%s\trand16k_write_MiB_s\t%.1f' % ('$label', '$r', j['jobs'][0]['write']['bw']/1024))" >> "$OUT"
  local cpu rss
  cpu=$(awk '{printf "%.1f", ($14+$15)/100}' "/proc/$PID/stat")
  rss=$(awk '/VmHWM/{printf "%d", $2/1024}' "/proc/$PID/status")
  printf '%s\t%s\tdaemon_cpu_s\t%s\n%s\t%s\tpeak_rss_MiB\t%s\n' "$label" "$r" "$cpu" "$label" "$r" "$rss" >> "$OUT"
  "$U" zpool destroy txb >/dev/null
  "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$DATA/pool"
}

for r in $(seq 1 "$ROUNDS"); do
  one before "$BIN_A" "$r"
  one after "$BIN_B" "$r"
done

python3 - "$OUT" <<'EOF'
import sys, statistics, collections
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    label, r, metric, v = line.split("\t")
    rows[(metric, label)].append(float(v))
metrics = sorted({m for m, _ in rows})
print("| metric | before (median, min-max) | after (median, min-max) | after/before |")
print("|---|---|---|---|")
for m in metrics:
    a, b = rows[(m, "before")], rows[(m, "after")]
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"| {m} | {ma:.1f} ({min(a):.1f}-{max(a):.1f}) | {mb:.1f} ({min(b):.1f}-{max(b):.1f}) | {mb/ma:.2f} |")
EOF
