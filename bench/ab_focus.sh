#!/usr/bin/env bash
# Focused before/after A/B of three single workloads, each run on a fresh
# pool, builds interleaved (before, after, before, after, ...): 4 KiB
# random reads of a cold 1 GiB file, a 1 GiB sequential write with an end
# fsync, and 4 KiB random writes with an fsync after each. For a workload
# whose figure in bench/before_after.sh looks different, to see whether
# the difference survives without the rest of fs.sh's sequence around it.
#
# usage: bench/ab_focus.sh BEFORE_BIN AFTER_BIN [ROUNDS]
# env: DATA [/var/tmp/uzfs-abf]  RUNTIME [10]
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: bench/ab_focus.sh BEFORE_BIN AFTER_BIN [ROUNDS]" >&2; exit 2; }
A=$(realpath "$1"); B=$(realpath "$2"); ROUNDS=${3:-3}
BASE=${DATA:-/var/tmp/uzfs-abf}; RUNTIME=${RUNTIME:-10}
one() { # binary label
  local U=$1 L=$2 D="$BASE/$2"
  export UZFS_RUNDIR="$D/run"
  "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"; mkdir -p "$D"; truncate -s 8G "$D/d0" "$D/d1"
  local M="$D/mnt"
  "$U" zpool create -f -m "$M" abf mirror "$D/d0" "$D/d1" >/dev/null
  sync; echo 3 > /proc/sys/vm/drop_caches
  fio --name=s --ioengine=psync --direct=0 --filename="$M/f" --size=1G --rw=write --bs=1M \
      --end_fsync=1 --output-format=json --output="$D/s.json"
  sync; echo 3 > /proc/sys/vm/drop_caches; "$U" zinject -a abf
  fio --name=r --ioengine=psync --direct=0 --filename="$M/f" --size=1G --rw=randread --bs=4k \
      --runtime="$RUNTIME" --time_based=1 --output-format=json --output="$D/r.json"
  fio --name=l --ioengine=psync --direct=0 --filename="$M/g" --size=256M --rw=read --bs=1M \
      --create_only=1 --output=/dev/null; sync
  fio --name=w --ioengine=psync --direct=0 --filename="$M/g" --size=256M --rw=randwrite --bs=4k \
      --runtime="$RUNTIME" --time_based=1 --fsync=1 --overwrite=1 --output-format=json --output="$D/w.json"
  python3 - "$D" "$L" <<'PY'
import json, sys
d, l = sys.argv[1], sys.argv[2]
j = lambda n: json.load(open(f"{d}/{n}.json"))["jobs"][0]
print(f"{l}\tseq_write_MiBps\t{j('s')['write']['bw'] / 1024:.0f}")
print(f"{l}\trandread4k_iops\t{j('r')['read']['iops']:.0f}")
print(f"{l}\tfsync4k_iops\t{j('w')['write']['iops']:.0f}")
PY
  "$U" zpool destroy abf; "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"
}
mkdir -p "$BASE"
for r in $(seq 1 "$ROUNDS"); do one "$A" before; one "$B" after; done
