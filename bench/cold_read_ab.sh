#!/usr/bin/env bash
# A cold sequential read with two uzfs builds, interleaved: what the
# daemon read from its device files (`rchar` of /proc/PID/io, so a block
# read twice shows), its CPU seconds per GiB and the throughput, and the
# ARC's `iohits` (misses that waited for a read in flight) where the
# build counts them. Each run makes a fresh pool of NDEV sparse 4 GiB
# files in LAYOUT, writes a SIZE file with 1 MiB writes and an end fsync,
# drops every cache (drop_caches, `zinject -a`) and reads it back with
# 1 MiB reads (fio, psync).
#
# usage: bench/cold_read_ab.sh BEFORE_BIN AFTER_BIN [ROUNDS]
# env: LAYOUTS ["raidz2:6 mirror:2"] (layout:devices, each run in turn)
#      DATA [/var/tmp/uzfs-coldread] (/dev/shm/... takes the disk out)
#      SIZE [2G]   IOSTAT [unset] (set: `zpool iostat -l` after each read)
# Output: one line per run, then medians per build and layout.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: bench/cold_read_ab.sh BEFORE_BIN AFTER_BIN [ROUNDS]" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "bench/cold_read_ab.sh: must run as root" >&2; exit 1; }
A=$(realpath "$1"); B=$(realpath "$2"); ROUNDS=${3:-4}
LAYOUTS=${LAYOUTS:-raidz2:6 mirror:2}
D=${DATA:-/var/tmp/uzfs-coldread}; SIZE=${SIZE:-2G}
HZ=$(getconf CLK_TCK)
GIB=$(python3 -c "import sys; s='$SIZE'; m={'G':1,'M':1/1024}; print(float(s[:-1])*m[s[-1]])")
OUT=$(mktemp)
one() { # binary layout ndev
  local U=$1 L=$2 N=$3
  export UZFS_RUNDIR="$D/run"
  "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"; mkdir -p "$D"
  local devs=() i
  for i in $(seq 0 $((N - 1))); do truncate -s 4G "$D/d$i"; devs+=("$D/d$i"); done
  "$U" zpool create -f -m "$D/mnt" crd "$L" "${devs[@]}" >/dev/null
  local P; P=$(cat "$UZFS_RUNDIR/uzfsd.pid")
  fio --name=s --ioengine=psync --filename="$D/mnt/f" --size="$SIZE" --rw=write --bs=1M \
      --end_fsync=1 --output-format=json --output="$D/s.json" >/dev/null
  sync; echo 3 > /proc/sys/vm/drop_caches; "$U" zinject -a crd >/dev/null
  local c0 c1 r0 r1
  c0=$(awk '{print $14 + $15}' "/proc/$P/stat"); r0=$(awk '/^rchar/{print $2}' "/proc/$P/io")
  fio --name=c --ioengine=psync --filename="$D/mnt/f" --size="$SIZE" --rw=read --bs=1M \
      --output-format=json --output="$D/c.json" >/dev/null
  c1=$(awk '{print $14 + $15}' "/proc/$P/stat"); r1=$(awk '/^rchar/{print $2}' "/proc/$P/io")
  sleep 1.2 # the arcstats file is rewritten every second
  local io; io=$(awk '$1 == "iohits" {print $3}' "$UZFS_RUNDIR/arcstats" 2>/dev/null || true)
  [ -n "${IOSTAT:-}" ] && "$U" zpool iostat -l crd
  python3 - "$D/c.json" "$(basename "$U")" "$L" "$c0" "$c1" "$r0" "$r1" "$HZ" "$GIB" "${io:--}" <<'PY' | tee -a "$OUT"
import json, sys
j, b, l, c0, c1, r0, r1, hz, gib, io = sys.argv[1:]
bw = json.load(open(j))['jobs'][0]['read']['bw'] / 1024
cpu = (float(c1) - float(c0)) / float(hz) / float(gib)
print(f"{b} {l} MiB/s={bw:.0f} cpu_s/GiB={cpu:.2f} read_GiB={(int(r1) - int(r0)) / 2**30:.2f} iohits={io}")
PY
  "$U" zpool destroy crd >/dev/null; "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"
}
for _ in $(seq "$ROUNDS"); do
  for U in "$A" "$B"; do
    for lay in $LAYOUTS; do one "$U" "${lay%%:*}" "${lay##*:}"; done
  done
done
python3 - "$OUT" <<'PY'
import sys, statistics as st, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    kv = dict(x.split('=') for x in f[2:])
    runs[(f[0], f[1])].append(kv)
print("| build | layout | cold read MiB/s median (range) | CPU s/GiB median (range) | GiB read from devices | iohits |")
print("|---|---|---|---|---|---|")
for (b, l), rs in runs.items():
    def col(k):
        v = [float(r[k]) for r in rs]
        return f"{st.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" if k != 'MiB/s' else f"{st.median(v):.0f} ({min(v):.0f}-{max(v):.0f})"
    io = [r['iohits'] for r in rs]
    print(f"| {b} | {l} | {col('MiB/s')} | {col('cpu_s/GiB')} | {col('read_GiB')} | {' '.join(io)} |")
PY
rm -f "$OUT"
