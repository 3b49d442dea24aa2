#!/usr/bin/env bash
# Partly written records filled at the write (default) or at the sync
# (`UZFS_FILL_AT_SYNC=1`, dmu/partial.rs): random writes of part of a
# record into a file whose records are on disk only (laid out, then
# `zinject -a` and drop_caches), through a mounted mirror of two files on
# the disk, alternated on a fresh daemon each run. Per run: fio's MiB/s
# and write p99, daemon CPU seconds, peak RSS; then medians and ranges.
#
# usage: bench/fill_at_sync.sh [BIN] [ROUNDS]
# env: DATA [/var/tmp/uzfs-fill]  SIZE [1G]  BS [16k]  DIRECT [1]  RUNTIME [20]
set -euo pipefail
U=$(realpath "${1:-target/release/uzfs}"); ROUNDS=${2:-3}
D=${DATA:-/var/tmp/uzfs-fill}; SIZE=${SIZE:-1G}; BS=${BS:-16k}
DIRECT=${DIRECT:-1}; RUNTIME=${RUNTIME:-20}
HZ=$(getconf CLK_TCK)
export UZFS_RUNDIR="$D/run"
OUT="$D.tsv"; : > "$OUT"
one() { # fill(0|1) round
  export UZFS_FILL_AT_SYNC=$1
  "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"; mkdir -p "$D"; truncate -s 8G "$D/d0" "$D/d1"
  "$U" zpool create -f -m "$D/mnt" fill mirror "$D/d0" "$D/d1" >/dev/null
  fio --name=layout --ioengine=psync --filename="$D/mnt/f" --size="$SIZE" --rw=write \
      --bs=1M --end_fsync=1 >/dev/null
  "$U" zinject -a fill >/dev/null; sync; echo 3 > /proc/sys/vm/drop_caches
  local P c0 c1 hwm res; P=$(cat "$UZFS_RUNDIR/uzfsd.pid")
  c0=$(awk -v hz="$HZ" '{print ($14 + $15) / hz}' "/proc/$P/stat")
  res=$(fio --name=w --ioengine=psync --direct="$DIRECT" --filename="$D/mnt/f" --size="$SIZE" \
      --rw=randwrite --bs="$BS" --runtime="$RUNTIME" --time_based=1 --end_fsync=1 \
      --overwrite=1 --output-format=json | python3 -c '
import json, sys
w = json.load(sys.stdin)["jobs"][0]["write"]
print(w["bw"] / 1024, w["clat_ns"]["percentile"]["99.000000"] / 1000)')
  c1=$(awk -v hz="$HZ" '{print ($14 + $15) / hz}' "/proc/$P/stat")
  hwm=$(awk '/^VmHWM:/{print $2 / 1024}' "/proc/$P/status")
  read -r bw p99 <<<"$res"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$bw" "$p99" \
    "$(python3 -c "print($c1 - $c0)")" "$hwm" | tee -a "$OUT"
  "$U" zpool destroy fill >/dev/null; "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"
}
for r in $(seq 1 "$ROUNDS"); do one 0 "$r"; one 1 "$r"; done
python3 - "$OUT" <<'PY'
import statistics as st, sys, collections
v = collections.defaultdict(lambda: ([], [], [], []))
for line in open(sys.argv[1]):
    m, _, *xs = line.rstrip("\n").split("\t")
    for i, x in enumerate(xs):
        v[m][i].append(float(x))
f = lambda a: f"{st.median(a):.4g} ({min(a):.4g}-{max(a):.4g})"
print("| UZFS_FILL_AT_SYNC | MiB/s | write p99 us | daemon CPU s | peak RSS MiB |")
print("|---|---:|---:|---:|---:|")
for m, cols in sorted(v.items()):
    print(f"| {m} | " + " | ".join(f(c) for c in cols) + " |")
PY
