#!/usr/bin/env bash
# One fsync probe of a uzfs build, for side-by-side comparisons of two
# builds (run them alternately, at least twice each: the disk drifts).
# A fresh 2 x 3 GiB mirror of written files on each run, its daemon
# started for it; fio's files laid out first, then 6 s for the layout's
# txg to settle.
#
#   4k JOBS [RECORDSIZE]  4 KiB random writes, fsync after each, JOBS jobs,
#                         8 s: IOPS, daemon CPU s/GiB, fsync mean and p99
#   1m                    1 MiB writes with an fsync after each, then with one
#                         at the end, 8 s each: MiB/s and daemon CPU s/GiB
#
# usage: bench/fsync_ab.sh BIN 4k JOBS [RECORDSIZE] | BIN 1m
# env: DATA [/var/tmp/uzfs-fsyncab]  (extra env such as UZFS_ZIL_INFLIGHT
#      reaches the daemon)
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: bench/fsync_ab.sh BIN 4k JOBS [RECORDSIZE] | BIN 1m" >&2; exit 2; }
U=$(realpath "$1"); MODE=$2
D=${DATA:-/var/tmp/uzfs-fsyncab}
export UZFS_RUNDIR=$D/run UZFS_LOG=${UZFS_LOG:-info}
. "$(dirname "$0")/lib.sh"
mkdir -p "$D"
written_files 3G "$D/d0" "$D/d1"
cleanup() { "$U" zpool destroy pp >/dev/null 2>&1 || true; "$U" daemon --stop >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
RS=128K; JOBS=1
[ "$MODE" = 4k ] && { JOBS=${3:?jobs}; RS=${4:-128K}; }
"$U" zpool create -f -O recordsize="$RS" -m "$D/mnt" pp mirror "$D/d0" "$D/d1" >/dev/null
PID=$(cat "$D/run/uzfsd.pid")
ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
BS=4k; [ "$MODE" = 1m ] && BS=1M
fio --name=w --directory="$D/mnt" --rw=write --bs=1M --size=64M --numjobs=$JOBS \
    --create_only=1 --output=/dev/null >/dev/null
sleep 6
# probe LABEL FIO-ARGS...: one fio run, one line of results.
probe() {
  local label=$1; shift
  local c0 c1
  c0=$(ticks)
  fio --name=w --directory="$D/mnt" --ioengine=psync --size=64M --runtime=8 \
      --time_based=1 --overwrite=1 --group_reporting=1 --output-format=json \
      --output="$D/out.json" "$@" >/dev/null
  c1=$(ticks)
  python3 - "$D/out.json" $((c1 - c0)) "$(getconf CLK_TCK)" "$label" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
w = j["write"]; gib = w["io_bytes"] / 2**30
cpu = int(sys.argv[2]) / int(sys.argv[3]) / gib if gib else 0
s = j["sync"]["lat_ns"] if j["sync"]["total_ios"] else None
lat = f" fsync mean {s['mean'] / 1000:.0f} us p99 {s['percentile']['99.000000'] / 1000:.0f} us" if s else ""
print(f"{sys.argv[4]}: {w['iops']:.0f} IOPS {w['bw'] / 1024:.0f} MiB/s, daemon {cpu:.2f} CPU s/GiB{lat}")
PY
}
if [ "$MODE" = 4k ]; then
  probe "4k x$JOBS rs=$RS" --rw=randwrite --bs=4k --numjobs=$JOBS --fsync=1
else
  probe "1m fsync each" --rw=write --bs=1M --fsync=1
  probe "1m end fsync" --rw=write --bs=1M --end_fsync=1
fi
