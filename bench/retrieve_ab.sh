#!/usr/bin/env bash
# Writes of part of records that the daemon does not hold but the kernel
# above the mount does (zpl/pagecache.rs): a SIZE file written with dd
# (its pages stay in the kernel's page cache; `UZFS_ARC_CACHE_WRITES=never`
# keeps them out of the ARC), the pool's device files dropped from the
# host's page cache, then 16 KiB buffered random writes for RUNTIME s with
# an end fsync (fio, --invalidate=0 so fio keeps the file's pages; fio's
# own layout drops them, which is why bench/fs.sh cannot show this). Three
# configurations interleaved on fresh pools (a mirror of two 8 GiB files):
#
#   retrieve   never, the rest of each record asked of the kernel (default)
#   device     never, UZFS_FUSE_RETRIEVE=0: read from the pool
#   always     written records kept in the ARC (the default policy)
#
# Per run: MiB/s, daemon CPU seconds, the longest fsync, data blocks read from the devices
# (`demand_data_misses` + `prefetch_data_misses` + `uzfs_partial_filled_sync`:
# a partial record's old version is read ahead, and the sync reads what
# is still missing), records filled from the kernel; then medians and
# ranges.
#
# With LAYOUT=fio the file is laid out as bench/fs.sh does (fio
# --create_only, then sync) and the writer runs with fio's default
# --invalidate=1, which drops the file's pages first: the kernel holds
# nothing to answer with, so this measures what keeping written data in
# the ARC (always) saves over reading the pool (never) in fs.sh's shape.
#
# usage: bench/retrieve_ab.sh [BIN] [ROUNDS]
# env: DATA [/var/tmp/uzfs-retrieve]  SIZE [1G]  RUNTIME [10]
#      LAYOUT [dd|fio]  CONFIGS ["retrieve device always"]; a config
#      written CFG=PATH runs with the binary at PATH (two builds, one run)
#      ARC_MAX [daemon default]: UZFS_ARC_MAX for every run
#      BS [16k]: the writer's block size; FSYNC_EACH=1: an fsync after
#      each write (bench/fs.sh's 4 KiB job is BS=4k FSYNC_EACH=1 SIZE=256M)
set -euo pipefail
command -v fio >/dev/null || apt-get install -y -q fio >/dev/null
[ "$(id -u)" = 0 ] || { echo "bench/retrieve_ab.sh: must run as root" >&2; exit 1; }
U=$(realpath "${1:-target/release/uzfs}"); ROUNDS=${2:-3}
D=${DATA:-/var/tmp/uzfs-retrieve}; SIZE=${SIZE:-1G}; RUNTIME=${RUNTIME:-10}
LAYOUT=${LAYOUT:-dd}; CONFIGS=${CONFIGS:-"retrieve device always"}
BS=${BS:-16k}; FSYNC=; [ "${FSYNC_EACH:-0}" = 1 ] && FSYNC=--fsync=1
export UZFS_RUNDIR="$D/run"
[ -n "${ARC_MAX:-}" ] && export UZFS_ARC_MAX=$ARC_MAX
INVALIDATE=0
OUT=$(mktemp)
stat_of() { awk -v n="$1" '$1 == n {print $3}' "$UZFS_RUNDIR/arcstats"; }
one() { # config[=binary]
  local cfg=${1%%=*} U=$U label=$1
  [[ $1 == *=* ]] && { U=$(realpath "${1#*=}"); label="$cfg@$(basename "$U")"; }
  case $cfg in
    retrieve) export UZFS_ARC_CACHE_WRITES=never UZFS_FUSE_RETRIEVE=1 ;;
    device) export UZFS_ARC_CACHE_WRITES=never UZFS_FUSE_RETRIEVE=0 ;;
    always) export UZFS_ARC_CACHE_WRITES=always UZFS_FUSE_RETRIEVE=1 ;;
  esac
  "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"; mkdir -p "$D"; truncate -s 8G "$D/d0" "$D/d1"
  "$U" zpool create -f -m "$D/mnt" rab mirror "$D/d0" "$D/d1" >/dev/null
  if [ "$LAYOUT" = fio ]; then
    fio --name=layout --ioengine=psync --direct=0 --filename="$D/mnt/f" --size="$SIZE" --rw=read \
        --bs=1M --create_only=1 --refill_buffers=1 --output=/dev/null
    INVALIDATE=1
  else
    head -c "$SIZE" /dev/urandom | dd of="$D/mnt/f" bs=1M iflag=fullblock status=none
  fi
  sync
  python3 - "$D/d0" "$D/d1" <<'PY'
import os, sys
for p in sys.argv[1:]:
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
  sleep 1.2
  local P c0 c1 m0 s0 r0
  P=$(cat "$UZFS_RUNDIR/uzfsd.pid")
  c0=$(awk '{print $14 + $15}' "/proc/$P/stat")
  m0=$(( $(stat_of demand_data_misses) + $(stat_of prefetch_data_misses) ))
  s0=$(stat_of uzfs_partial_filled_sync); r0=$(stat_of uzfs_partial_retrieved)
  fio --name=w --ioengine=psync --direct=0 --filename="$D/mnt/f" --size="$SIZE" --rw=randwrite \
      --invalidate=$INVALIDATE --bs="$BS" $FSYNC --runtime="$RUNTIME" --time_based=1 --end_fsync=1 --overwrite=1 \
      --refill_buffers=1 --output-format=json --output="$D/w.json" >/dev/null
  "$U" zpool sync rab
  c1=$(awk '{print $14 + $15}' "/proc/$P/stat")
  sleep 1.2
  python3 - "$D/w.json" "$label" "$c0" "$c1" "$(getconf CLK_TCK)" \
      "$(( $(stat_of demand_data_misses) + $(stat_of prefetch_data_misses) - m0 + $(stat_of uzfs_partial_filled_sync) - s0 ))" \
      "$(( $(stat_of uzfs_partial_retrieved) - r0 ))" <<'PY' | tee -a "$OUT"
import json, sys
j, cfg, c0, c1, hz, dev, got = sys.argv[1:]
job = json.load(open(j))['jobs'][0]
bw = job['write']['bw'] / 1024
# The longest fsync (FSYNC_EACH=1; else the end fsync), ms.
fs_max = job.get('sync', {}).get('lat_ns', {}).get('max', 0) / 1e6
print(f"{cfg} MiB/s={bw:.1f} cpu_s={(float(c1) - float(c0)) / float(hz):.2f} device_reads={dev} from_kernel={got} fsync_max_ms={fs_max:.1f}")
PY
  "$U" zpool destroy rab >/dev/null; "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"
}
for _ in $(seq "$ROUNDS"); do
  for cfg in $CONFIGS; do one $cfg; done
done
python3 - "$OUT" <<'PY'
import sys, statistics as st, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    runs[f[0]].append(dict(x.split('=') for x in f[1:]))
print("| config | MiB/s median (range) | daemon CPU s median (range) | records read from the devices | records from the kernel | longest fsync, ms |")
print("|---|---|---|---|---|---|")
for cfg, rs in runs.items():
    def col(k, fmt):
        v = [float(r[k]) for r in rs]
        return f"{st.median(v):{fmt}} ({min(v):{fmt}}-{max(v):{fmt}})"
    print(f"| {cfg} | {col('MiB/s', '.1f')} | {col('cpu_s', '.2f')} | {col('device_reads', '.0f')} | {col('from_kernel', '.0f')} | {col('fsync_max_ms', '.1f')} |")
PY
rm -f "$OUT"
