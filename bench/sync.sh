#!/usr/bin/env bash
# Synchronous writes (issue #14): fio 4 KiB random writes with an fsync
# after each, 1 job and 8 jobs, on a uzfs mirror with sync=standard,
# sync=always (no fsync needed: every write is committed) and
# sync=disabled, beside ext4 on a loop device on the same disk. Rounds are
# interleaved (uzfs, ext4, uzfs, ext4, ...) because this VM's disk changes
# speed from minute to minute; the table gives medians, the spread
# (min-max) and, for uzfs, daemon CPU seconds per GiB written and peak RSS.
#
# Full runs add: uzfs pools with a separate log device (a file on the same
# disk: `slog`; a file on tmpfs, forced: `tmpslog`) and zfs-fuse (Debian's
# userspace ZFS, a mirror, its daemon in a private mount namespace as
# ../shared/peers/peers.sh runs it; installed with apt if missing).
#
# Also, on sync=standard and ext4 only: 1 MiB writes with an fsync after
# each (MiB/s: whole blocks go by pointer, written once) beside uzfs's own
# 1 MiB sequential write without fsyncs (one at the end), and sqlite3
# inserts, one transaction each, journal_mode=WAL, synchronous=FULL
# (transactions/s). The uzfs daemon's `zilstat` totals follow the table
# (commits against log writes: group commit).
#
# pgbench (PostgreSQL's TPC-B-like default, scale 10, 1 and 8 clients,
# the server's durable defaults) on uzfs sync=standard, uzfs with the log
# device on a file and ext4 (a smoke run: uzfs only, if PostgreSQL is
# installed; full runs install it).
#
# A uzfs dataset with recordsize=4K (`rs4k`) runs the same 4 KiB job: the
# tuning OpenZFS documents for small random writes. With the default
# 128 KiB records each 4 KiB write dirties a whole record, so the txg
# writes 32 times the bytes fio wrote, and on this VM every log flush
# waits for that data too.
#
# Full runs write every device file in full first (zeros), as a disk's
# blocks all exist: on a sparse file each copy-on-write block lands in a
# hole the host filesystem must allocate, a journal commit on every log
# flush that no disk pays (1-job fsync IOPS 1,500 sparse against 2,100
# written, bench/RESULTS.md). SPARSE=1 keeps them sparse.
#
# usage: bench/sync.sh [--smoke]
#   --smoke  one short round of each (CI: checks the harness)
# env: DATA [/var/tmp/uzfs-syncbench]  RUNTIME [10]  ROUNDS [3]  SPARSE [0]
#      UZFS_BIN [target/release/uzfs, built first]
set -euo pipefail
cd "$(dirname "$0")/.."
SMOKE=0
for a in "$@"; do
  case "$a" in
    --smoke) SMOKE=1 ;;
    *) echo "usage: bench/sync.sh [--smoke]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "bench/sync.sh: must run as root (FUSE, loop devices)" >&2; exit 1; }
DATA=${DATA:-/var/tmp/uzfs-syncbench}
if [ $SMOKE = 1 ]; then
  RUNTIME=${RUNTIME:-1}; ROUNDS=${ROUNDS:-1}; SIZE=32M; DISK=1G; SPARSE=1
else
  RUNTIME=${RUNTIME:-10}; ROUNDS=${ROUNDS:-3}; SIZE=64M; DISK=3G; SPARSE=${SPARSE:-0}
fi
. bench/lib.sh
# mkdisk FILE...: a device file of $DISK bytes, written in full unless SPARSE=1.
mkdisk() {
  if [ "$SPARSE" = 1 ]; then truncate -s $DISK "$@"; else written_files $DISK "$@"; fi
}
if [ -n "${UZFS_BIN:-}" ]; then
  U=$(realpath "$UZFS_BIN")
else
  cargo build --release --bins -q
  U=$(pwd)/target/release/uzfs
fi
export UZFS_RUNDIR=$DATA/run
ZPID=""
# PostgreSQL for pgbench: installed for full runs; a smoke run uses it if
# it is there and says so if not.
PGBIN=$(pg_bin)
if [ -z "$PGBIN" ] && [ $SMOKE = 0 ]; then
  apt-get install -y -q postgresql >/dev/null
  PGBIN=$(pg_bin)
fi
cleanup() {
  for d in "$DATA"/pg-*/data; do
    [ -f "$d/postmaster.pid" ] &&
      runuser -u postgres -- "$PGBIN/pg_ctl" -D "$d" -m immediate stop >/dev/null 2>&1 || true
  done
  $U zpool destroy -f sb >/dev/null 2>&1 || true
  $U zpool destroy -f sl >/dev/null 2>&1 || true
  $U zpool destroy -f st >/dev/null 2>&1 || true
  rm -f /dev/shm/uzfs-syncbench-slog
  if [ -n "$ZPID" ] && kill -0 "$ZPID" 2>/dev/null; then
    nsenter -t "$ZPID" -m -- zpool destroy -f zf >/dev/null 2>&1 || true
    kill "$ZPID" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$ZPID" 2>/dev/null || break; sleep 0.25; done
  fi
  $U daemon --stop >/dev/null 2>&1 || true
  if mountpoint -q "$DATA/ext4" 2>/dev/null; then umount "$DATA/ext4"; fi
  if [ -n "${LOOP:-}" ]; then losetup -d "$LOOP" 2>/dev/null || true; fi
}
trap cleanup EXIT
cleanup
rm -rf "$DATA"; mkdir -p "$DATA/out" "$DATA/ext4"
mkdisk "$DATA/d0" "$DATA/d1" "$DATA/e0"
if [ $SMOKE = 0 ]; then
  # First, so that its private mount namespace holds no copy of the uzfs
  # mounts made below (a copy keeps a FUSE connection alive after uzfs
  # unmounts it, and the pool's destroy waits for it forever).
  # zfs-fuse, as peers.sh runs it: its own daemon in a private mount
  # namespace (private /run/zfs, /var/lib/zfs), a mirror of two files.
  command -v zfs-fuse >/dev/null || apt-get install -y -q zfs-fuse >/dev/null
  mkdisk "$DATA/z0" "$DATA/z1"
  ns="$DATA/zfsns"; mkdir -p "$ns/run" "$ns/lock" "$ns/lib" /run/zfs /run/lock/zfs /var/lib/zfs
  unshare -m --propagation private bash -c "
    mount --bind '$ns/run' /run/zfs && mount --bind '$ns/lock' /run/lock/zfs &&
    mount --bind '$ns/lib' /var/lib/zfs &&
    exec zfs-fuse -p '$ns/zfs-fuse.pid' --no-kstat-mount"
  for _ in $(seq 50); do [ -s "$ns/zfs-fuse.pid" ] && [ -S "$ns/run/zfs_socket" ] && break; sleep 0.2; done
  ZPID=$(cat "$ns/zfs-fuse.pid")
  for _ in $(seq 50); do nsenter -t "$ZPID" -m -- zpool list >/dev/null 2>&1 && break; sleep 0.2; done
fi
$U zpool create -f -m "$DATA/mnt" sb mirror "$DATA/d0" "$DATA/d1" >/dev/null
# The files are laid out once, in 1 MiB writes, before the datasets get
# their sync setting (fio would lay them out in 4 KiB writes, each a txg
# commit under sync=always).
DSETS="standard always disabled"
[ $SMOKE = 0 ] && DSETS="$DSETS rs4k"
for s in $DSETS; do
  if [ $s = rs4k ]; then
    $U zfs create -o recordsize=4K sb/$s >/dev/null
  else
    $U zfs create sb/$s >/dev/null
  fi
  fio --name=w --directory="$DATA/mnt/$s" --rw=write --bs=1M --size=$SIZE \
      --numjobs=8 --create_only=1 --output=/dev/null >/dev/null 2>&1
  [ $s = rs4k ] || $U zfs set sync=$s sb/$s >/dev/null
done
if [ $SMOKE = 0 ]; then
  # Separate log devices: a file on the same disk, and one on tmpfs.
  mkdisk "$DATA/d2" "$DATA/d3" "$DATA/d4" "$DATA/d5"
  DISK=1G mkdisk "$DATA/l0"
  truncate -s 1G /dev/shm/uzfs-syncbench-slog
  $U zpool create -f -m "$DATA/mnt-sl" sl mirror "$DATA/d2" "$DATA/d3" log "$DATA/l0" >/dev/null
  $U zpool create -f -m "$DATA/mnt-st" st mirror "$DATA/d4" "$DATA/d5" \
    log /dev/shm/uzfs-syncbench-slog >/dev/null
  for p in sl st; do
    fio --name=w --directory="$DATA/mnt-$p" --rw=write --bs=1M --size=$SIZE \
        --numjobs=8 --create_only=1 --output=/dev/null >/dev/null 2>&1
  done
  nsenter -t "$ZPID" -m -- zpool create -f -o cachefile=none -m "$DATA/zf" zf \
    mirror "$DATA/z0" "$DATA/z1"
  nsenter -t "$ZPID" -m -- fio --name=w --directory="$DATA/zf" --rw=write --bs=1M \
    --size=$SIZE --numjobs=8 --create_only=1 --output=/dev/null >/dev/null 2>&1
  LOOP=$(losetup -f --show "$DATA/e0")
  mkfs.ext4 -q -F "$LOOP"
  mount "$LOOP" "$DATA/ext4"
  fio --name=w --directory="$DATA/ext4" --rw=write --bs=1M --size=$SIZE \
      --numjobs=8 --create_only=1 --output=/dev/null >/dev/null 2>&1
fi
PID=$(cat "$UZFS_RUNDIR/uzfsd.pid")

cpu_ticks() { awk '{print $14 + $15}' "/proc/${1:-$PID}/stat"; }

# run DIR NAME JOBS ROUND: one fio job set; writes $DATA/out/NAME-jJOBS-ROUND.json
# (and .cpu: daemon CPU ticks used, for uzfs).
run() {
  local dir=$1 name=$2 jobs=$3 round=$4 out="$DATA/out/$2-j$3-$4"
  local fsync=1 ns=()
  # sync=always commits every write by itself: no fsync asked.
  [ "$name" = always ] && fsync=0
  [ "$name" = zfsfuse ] && ns=(nsenter -t "$ZPID" -m --)
  "${ns[@]}" fio --name=w --directory="$dir" --ioengine=psync --rw=randwrite --bs=4k \
      --size=$SIZE --numjobs=$jobs --runtime=$RUNTIME --time_based=1 \
      --fsync=$fsync --overwrite=1 --group_reporting=1 \
      --output-format=json --output="$out.json.tmp" >/dev/null 2>&1 &
  local f=$! c0=0 pid=$PID
  [ "$name" = zfsfuse ] && pid=$ZPID
  [ "$name" != ext4 ] && c0=$(cpu_ticks $pid)
  wait $f
  mv "$out.json.tmp" "$out.json"
  [ "$name" != ext4 ] && echo $(( $(cpu_ticks $pid) - c0 )) > "$out.cpu"
  return 0
}

# seq1m DIR NAME ROUND: 1 MiB writes, fsync after each -> NAME-seq-ROUND.json
seq1m() {
  local out="$DATA/out/$2-seq-$3"
  fio --name=s --directory="$1" --ioengine=psync --rw=write --bs=1M \
      --size=$SIZE --runtime=$RUNTIME --time_based=1 --fsync=1 \
      --overwrite=1 --output-format=json --output="$out.json" >/dev/null 2>&1
}

# seqw DIR NAME ROUND: 1 MiB writes, one fsync at the end -> NAME-seqw-ROUND.json
seqw() {
  local out="$DATA/out/$2-seqw-$3"
  fio --name=s --directory="$1" --ioengine=psync --rw=write --bs=1M \
      --size=$SIZE --runtime=$RUNTIME --time_based=1 --end_fsync=1 \
      --overwrite=1 --output-format=json --output="$out.json" >/dev/null 2>&1
}

# pg_setup DIR NAME PORT: a PostgreSQL cluster in DIR/pg (its socket in
# $DATA/pg-NAME), started, with pgbench's tables at scale 10. Defaults
# otherwise: fsync=on, synchronous_commit=on, full_page_writes=on,
# wal_sync_method=fdatasync.
pg_setup() {
  local sock="$DATA/pg-$2"
  mkdir -p "$1/pg" "$sock"; chown postgres "$1/pg" "$sock"
  ln -sfn "$1/pg/data" "$sock/data"
  runuser -u postgres -- "$PGBIN/initdb" -A trust -D "$1/pg/data" >/dev/null
  runuser -u postgres -- "$PGBIN/pg_ctl" -D "$1/pg/data" -l "$sock/log" -w \
    -o "-k $sock -c listen_addresses='' -p $3" start >/dev/null
  runuser -u postgres -- "$PGBIN/createdb" -h "$sock" -p "$3" bench
  runuser -u postgres -- "$PGBIN/pgbench" -h "$sock" -p "$3" -i -s 10 -q bench >/dev/null 2>&1
}

# pgb NAME PORT CLIENTS ROUND: TPC-B-like pgbench for $RUNTIME s ->
# NAME-pgCLIENTS-ROUND.txt (tps).
pgb() {
  runuser -u postgres -- "$PGBIN/pgbench" -h "$DATA/pg-$1" -p "$2" -c "$3" \
    -j $(( $3 < 2 ? $3 : 2 )) -T "$RUNTIME" bench 2>/dev/null |
    awk '/^tps/ {print $3}' > "$DATA/out/$1-pg$3-$4.txt"
}

# sqlite DIR NAME ROUND: inserts, one transaction each -> NAME-sql-ROUND.txt (tx/s)
sqlite() {
  rm -f "$1/b.db" "$1/b.db-wal" "$1/b.db-shm"
  python3 - "$1/b.db" "$RUNTIME" > "$DATA/out/$2-sql-$3.txt" <<'PY'
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute('PRAGMA journal_mode=WAL'); c.execute('PRAGMA synchronous=FULL')
c.execute('CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)')
end = time.time() + float(sys.argv[2]); n = 0; t0 = time.time()
while time.time() < end:
    c.execute('BEGIN'); c.execute('INSERT INTO t(v) VALUES(randomblob(200))'); c.execute('COMMIT'); n += 1
print(n / (time.time() - t0))
PY
}

STACKS="standard always disabled"
[ $SMOKE = 0 ] && STACKS="$STACKS rs4k slog tmpslog ext4 zfsfuse"
dir_of() {
  case $1 in
    ext4) echo "$DATA/ext4" ;;
    slog) echo "$DATA/mnt-sl" ;;
    tmpslog) echo "$DATA/mnt-st" ;;
    zfsfuse) echo "$DATA/zf" ;;
    *) echo "$DATA/mnt/$1" ;;
  esac
}
PGSTACKS=""
if [ -n "$PGBIN" ]; then
  PGSTACKS="standard"
  [ $SMOKE = 0 ] && PGSTACKS="standard slog ext4"
  port=5490
  for s in $PGSTACKS; do
    port=$((port + 1)); pg_setup "$(dir_of $s)" $s $port
  done
else
  echo "bench/sync.sh: PostgreSQL not installed; no pgbench in this smoke run" >&2
fi
pg_port() { local p=5490 s; for s in $PGSTACKS; do p=$((p + 1)); [ $s = "$1" ] && echo $p; done; }
for r in $(seq 1 $ROUNDS); do
  for s in $PGSTACKS; do
    for c in 1 8; do pgb $s "$(pg_port $s)" $c $r; done
  done
  for jobs in 1 8; do
    for s in $STACKS; do
      run "$(dir_of $s)" $s $jobs $r
    done
  done
  for s in standard ext4; do
    [ $s = ext4 ] && [ $SMOKE = 1 ] && continue
    d=$(dir_of $s)
    seq1m "$d" $s $r
    [ $s = standard ] && seqw "$d" $s $r
    sqlite "$d" $s $r
  done
done
ZIL=$($U zilstat -p sb)
HWM=$(awk '/VmHWM/ {print $2}' "/proc/$PID/status")

python3 - "$DATA/out" "$STACKS" "$ROUNDS" "$HWM" "$(getconf CLK_TCK)" "$PGSTACKS" <<'PY'
import json, os, statistics, sys
out, stacks, rounds, hwm, tck = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
pgstacks = sys.argv[6].split()
def load(s, j, r):
    d = json.load(open(f"{out}/{s}-j{j}-{r}.json"))["jobs"][0]
    w = d["write"]
    lat = d["sync"]["lat_ns"] if d["sync"]["total_ios"] else w["clat_ns"]
    p99 = lat.get("percentile", {}).get("99.000000", 0) / 1000
    cpu = None
    if os.path.exists(f"{out}/{s}-j{j}-{r}.cpu"):
        gib = w["io_bytes"] / 2**30
        cpu = int(open(f"{out}/{s}-j{j}-{r}.cpu").read()) / tck / gib if gib else 0
    return w["iops"], p99, cpu
def med(v): return statistics.median(v)
print("| 4 KiB random write + fsync | jobs | IOPS median (min-max) | p99 us median (min-max) | daemon CPU s/GiB | IOPS / ext4 |")
print("|---|---|---|---|---|---|")
ext = {}
if "ext4" in stacks:
    for j in (1, 8):
        ext[j] = med([load("ext4", j, r)[0] for r in range(1, rounds + 1)])
for s in stacks:
    for j in (1, 8):
        rs = [load(s, j, r) for r in range(1, rounds + 1)]
        iops = [x[0] for x in rs]; p99 = [x[1] for x in rs]
        cpu = [x[2] for x in rs if x[2] is not None]
        label = {"ext4": "ext4 on loop", "zfsfuse": "zfs-fuse mirror", "slog": "uzfs, log device (file)",
                 "tmpslog": "uzfs, log device (tmpfs)",
                 "rs4k": "uzfs recordsize=4K"}.get(s, f"uzfs sync={s}")
        ratio = f"{med(iops) / ext[j]:.2f}" if ext.get(j) else "-"
        c = f"{med(cpu):.1f}" if cpu else "-"
        print(f"| {label} | {j} | {med(iops):.0f} ({min(iops):.0f}-{max(iops):.0f}) | {med(p99):.0f} ({min(p99):.0f}-{max(p99):.0f}) | {c} | {ratio} |")
print(f"\nuzfs daemon peak RSS: {hwm // 1024} MiB. sync=always runs without fsync (each write is committed); its latency column is the write's.")
if "zfsfuse" in stacks:
    for j in (1, 8):
        z = med([load("zfsfuse", j, r)[0] for r in range(1, rounds + 1)])
        u = med([load("standard", j, r)[0] for r in range(1, rounds + 1)])
        print(f"uzfs sync=standard / zfs-fuse, {j} job(s): {u / z:.1f}x" if z else "")
print()
print("| sync workload | uzfs sync=standard median (min-max) | ext4 median (min-max) | uzfs / ext4 |")
print("|---|---|---|---|")
for kind, label in (("seq", "1 MiB write + fsync each (MiB/s)"), ("sql", "sqlite3 WAL+FULL inserts (tx/s)")):
    vals = {}
    for s in ("standard", "ext4"):
        v = []
        for r in range(1, rounds + 1):
            f = f"{out}/{s}-{kind}-{r}"
            if kind == "seq" and os.path.exists(f + ".json"):
                v.append(json.load(open(f + ".json"))["jobs"][0]["write"]["bw_bytes"] / 2**20)
            elif kind == "sql" and os.path.exists(f + ".txt"):
                v.append(float(open(f + ".txt").read() or 0))
        vals[s] = v
    u, e = vals["standard"], vals["ext4"]
    fmt = lambda v: f"{med(v):.0f} ({min(v):.0f}-{max(v):.0f})" if v else "-"
    ratio = f"{med(u) / med(e):.2f}" if u and e and med(e) else "-"
    print(f"| {label} | {fmt(u)} | {fmt(e)} | {ratio} |")
if pgstacks:
    print()
    print("| pgbench (scale 10, TPC-B-like) | clients | TPS median (min-max) | TPS / ext4 |")
    print("|---|---|---|---|")
    for c in (1, 8):
        tps = {}
        for s in pgstacks:
            v = []
            for r in range(1, rounds + 1):
                t = open(f"{out}/{s}-pg{c}-{r}.txt").read().strip()
                v.append(float(t) if t else 0.0)
            tps[s] = v
        for s in pgstacks:
            v = tps[s]
            e = med(tps["ext4"]) if "ext4" in tps else 0
            label = {"ext4": "ext4 on loop", "slog": "uzfs, log device (file)"}.get(s, f"uzfs sync={s}")
            ratio = f"{med(v) / e:.2f}" if e else "-"
            print(f"| {label} | {c} | {med(v):.0f} ({min(v):.0f}-{max(v):.0f}) | {ratio} |")
w = []
for r in range(1, rounds + 1):
    f = f"{out}/standard-seqw-{r}.json"
    if os.path.exists(f):
        w.append(json.load(open(f))["jobs"][0]["write"]["bw_bytes"] / 2**20)
s1 = []
for r in range(1, rounds + 1):
    f = f"{out}/standard-seq-{r}.json"
    if os.path.exists(f):
        s1.append(json.load(open(f))["jobs"][0]["write"]["bw_bytes"] / 2**20)
if w and s1:
    print(f"\nuzfs 1 MiB writes without fsync (one at the end): {med(w):.0f} MiB/s ({min(w):.0f}-{max(w):.0f});"
          f" with an fsync after each: {med(s1) / med(w):.2f}x of that")
PY
echo
echo "uzfs zilstat totals (cc commits, cwc log writes: cc/cwc is the group commit):"
echo "$ZIL"
