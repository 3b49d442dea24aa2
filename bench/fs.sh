#!/usr/bin/env bash
# uzfs filesystem benchmarks (issue #4): the peers' fio jobs and metadata
# test, run against a uzfs mirror mounted through FUSE, beside ext4 on a loop
# device (and with --peers zfs-fuse's mirror) on the same disk in one run.
#
#   seq write 1 MiB with end fsync      seq read 1 MiB, cold (caches dropped)
#   4 KiB random read                   4 KiB random write, fsync after each
#   16 KiB buffered random write        create 20,000 small files, then stat
#   daemon peak memory (VmHWM)
#
# The jobs are ../shared/peers/peers.sh's (same fio arguments; the metadata
# test has the same shape, bench/fslib.py); uzfs gets the same two 8 GiB
# sparse file disks as zfs-fuse's mirror. Smoke mode needs nothing outside
# the repository.
#
# usage: bench/fs.sh [--smoke] [--peers] [--uzfs-only]
#   --smoke      small sizes and short runs, uzfs only (CI: checks the harness)
#   --peers      also zfs-fuse (zmirror); ext4 always runs unless --smoke
#   --uzfs-only  full sizes, the uzfs pass only (bench/before_after.sh
#                interleaves such passes of two builds)
# env: DATA [/var/tmp/uzfs-fsbench]  RUNTIME [20]  SEQ_SIZE [2G]  REPEAT [5; 2 in smoke]
#      UZFS_BIN [target/release/uzfs, built first]: the binary to measure
# Output: a markdown table on stdout and in $DATA/report.md.
set -euo pipefail
cd "$(dirname "$0")/.."
SMOKE=0; PEERS=0; ONLY=0
for a in "$@"; do
  case "$a" in
    --smoke) SMOKE=1 ;;
    --peers) PEERS=1 ;;
    --uzfs-only) ONLY=1 ;;
    *) echo "usage: bench/fs.sh [--smoke] [--peers] [--uzfs-only]" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "bench/fs.sh: must run as root (FUSE mounts, loop devices, drop_caches)" >&2; exit 1; }
DATA=${DATA:-/var/tmp/uzfs-fsbench}
PEERS_SH=../shared/peers/peers.sh   # only for ext4 / zfs-fuse (not in --smoke)
LIB=$(pwd)/bench/fslib.py
if [ $SMOKE = 1 ]; then
  export RUNTIME=${RUNTIME:-2} SEQ_SIZE=${SEQ_SIZE:-128M} RW4K_SIZE=${RW4K_SIZE:-32M} RW16K_SIZE=${RW16K_SIZE:-64M} NFILES=${NFILES:-1000}
  DISK_SIZE=1G
else
  export RUNTIME=${RUNTIME:-20} SEQ_SIZE=${SEQ_SIZE:-2G} RW4K_SIZE=${RW4K_SIZE:-256M} RW16K_SIZE=${RW16K_SIZE:-1G} NFILES=${NFILES:-20000}
  DISK_SIZE=8G
fi
export DATA RESULTS="$DATA/results"
mkdir -p "$RESULTS"
if [ -n "${UZFS_BIN:-}" ]; then
  U=$(realpath "$UZFS_BIN")
else
  cargo build --release --bins -q
  U=$(pwd)/target/release/uzfs
fi
FLOOR="$U fuse-floor"

# ---------------------------------------------------------------- peers
if [ $SMOKE = 0 ] && [ $ONLY = 0 ]; then
  if [ ! -x "$PEERS_SH" ]; then
    echo "bench/fs.sh: $PEERS_SH not found; run with --smoke or provide the peers harness" >&2; exit 1
  fi
  cfgs="ext4"; [ $PEERS = 1 ] && cfgs="ext4 zmirror"
  DISK_SIZE=$DISK_SIZE "$PEERS_SH" all $cfgs >"$DATA/peers.log" 2>&1 || echo "peers.sh reported a failure (see $DATA/peers.log)" >&2
fi

# ---------------------------------------------------------------- uzfs
# uzfs as shipped: FUSE over io_uring where the kernel has it (setup.sh
# switches it on; so does this script). A second, create-only pass below
# measures /dev/fuse.
URING=/sys/module/fuse/parameters/enable_uring
[ -e "$URING" ] && echo Y > "$URING" 2>/dev/null || true
RES="$RESULTS/uzfs"; rm -rf "$RES"; mkdir -p "$RES"
# Start from a quiet machine, as the first peer did: the peers' teardown
# leaves gigabytes of their loop files still being written back.
if [ $SMOKE = 0 ]; then sync; echo 3 > /proc/sys/vm/drop_caches; sleep 5; fi
export UZFS_RUNDIR="$DATA/uzfs/run"
"$U" daemon --stop >/dev/null 2>&1 || true
rm -rf "$DATA/uzfs"; mkdir -p "$DATA/uzfs"
truncate -s "$DISK_SIZE" "$DATA/uzfs/disk0.img" "$DATA/uzfs/disk1.img"
M="$DATA/mnt/uzfs"
"$U" zpool create -f -m "$M" bench_uzfs mirror "$DATA/uzfs/disk0.img" "$DATA/uzfs/disk1.img"
awk -v m="$M" '$2==m{f=1} END{exit !f}' /proc/mounts || { echo "uzfs did not mount at $M" >&2; exit 1; }
PID=$(cat "$UZFS_RUNDIR/uzfsd.pid")
transport() { grep -o 'mounted bench_uzfs at .* over .*' "$UZFS_RUNDIR/uzfsd.log" | tail -1 | sed 's/^mounted bench_uzfs at [^ ]* over //'; }

metric() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "${3:-}" "${4:-}" >> "$RES/metrics.tsv"; }
now() { echo "$EPOCHREALTIME"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", b-a}'; }
# Cold means uzfs's block cache too: the kernel's drop_caches cannot reach
# memory in a user-space daemon, so `zinject -a` flushes it (OpenZFS's ARC
# gives memory back to drop_caches through its shrinker). And first the
# open txg is written (`sync` reaches the daemon as writebacks only; without
# `zpool sync` a walk right after the creates found their metadata still
# dirty in memory at the default sizes, and read it from disk only where
# a smaller dirty limit had synced it: a 512 MiB `arc_max` looked 0.66x).
drop_caches() {
  sync; "$U" zpool sync bench_uzfs || metric FAIL_sync "zpool sync failed"
  echo 3 > /proc/sys/vm/drop_caches
  "$U" zinject -a bench_uzfs || metric FAIL_flush "zinject -a failed"
}
fio_job() {
  local name=$1; shift
  local t0 t1; t0=$(now)
  fio --name="$name" --ioengine=psync --direct=0 --iodepth=1 --numjobs=1 \
      --refill_buffers=1 --output-format=json --output="$RES/fio-$name.json" "$@" 2> "$RES/fio-$name.err" \
      || { metric "FAIL_$name" "fio failed: $(tail -c 200 "$RES/fio-$name.err" | tr '\n\t' '  ')"; return 1; }
  t1=$(now)
  metric "${name}_wall_s" "$(elapsed "$t0" "$t1")" s
  python3 "$LIB" fio-metrics "$RES/fio-$name.json" "$name" >> "$RES/metrics.tsv"
}
fio_layout() {
  fio --name=layout --ioengine=psync --direct=0 --filename="$1" --size="$2" --rw=read --bs=1M \
      --create_only=1 --refill_buffers=1 --output=/dev/null
}

seqf="$M/seq.dat"; rw4="$M/rw4k.dat"; rw16="$M/rw16k.dat"
fio_job seqwrite --filename="$seqf" --rw=write --bs=1M --size="$SEQ_SIZE" --runtime="$RUNTIME" --end_fsync=1
fio_layout "$seqf" "$SEQ_SIZE"
drop_caches
fio_job seqread --filename="$seqf" --rw=read --bs=1M --size="$SEQ_SIZE" --runtime="$RUNTIME"
drop_caches
fio_job randread4k --filename="$seqf" --rw=randread --bs=4k --size="$SEQ_SIZE" --runtime="$RUNTIME" --time_based=1
fio_layout "$rw4" "$RW4K_SIZE"; sync
fio_job syncwrite4k --filename="$rw4" --rw=randwrite --bs=4k --size="$RW4K_SIZE" --runtime="$RUNTIME" --time_based=1 --fsync=1 --overwrite=1
fio_layout "$rw16" "$RW16K_SIZE"; sync
fio_job randwrite16k --filename="$rw16" --rw=randwrite --bs=16k --size="$RW16K_SIZE" --runtime="$RUNTIME" --time_based=1 --end_fsync=1 --overwrite=1
out=$(python3 "$LIB" create "$M/meta/tree" "$NFILES")
metric meta_create_s "${out% *}" s
t0=$(now); sync; t1=$(now); metric meta_sync_s "$(elapsed "$t0" "$t1")" s
# Seconds of one `ls -lR` from dropped caches, and of one warm stat walk
# (only the number is printed: drop_caches's output goes to stderr).
cold_ls() {
  local t0 t1
  drop_caches >&2; t0=$(now); ls -lR "$M/meta/tree" > /dev/null; t1=$(now)
  elapsed "$t0" "$t1"; echo
}
walk() { local out; out=$(python3 "$LIB" stat-walk "$M/meta/tree"); echo "${out% *}"; }
metric meta_lsR_cold_s "$(cold_ls)" s
metric meta_stat_s "$(walk)" s
# The two rows above are the peers' shape: one walk each. A warm walk of
# 20,000 files takes 0.05-0.14 s on this VM from one walk to the next,
# and the same walk of a copy of the tree on tmpfs, with no FUSE at all,
# 0.049 s or 0.096 s: the host runs the VM's vCPUs at two speeds that
# change from one second to the next (`taskset -c 0` 0.049 s five times
# while `-c 1` took 0.096; bench/RESULTS.md, "the walk's two speeds"),
# and a walk goes at the speed its vCPU has then. A cold one takes 0.2-0.45 s. One walk
# cannot tell two uzfs configurations apart (bench/before_after.sh), nor
# the median of a few: REPEAT more of each, their median, mean and the
# fastest (the one that ran on the fast vCPU throughout).
med() { sort -n | awk '{a[NR]=$1} END{print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
mean() { awk '{s+=$1} END{printf "%.4f\n", s/NR}'; }
# NAME_med_s, NAME_mean_s and NAME_min_s of the seconds in FILE.
spread() {
  metric "$1_med_s" "$(med < "$2")" s
  metric "$1_mean_s" "$(mean < "$2")" s
  metric "$1_min_s" "$(sort -n "$2" | head -1)" s
}
REPEAT=${REPEAT:-$([ $SMOKE = 1 ] && echo 2 || echo 10)}
# The ARC's metadata misses over the repeated walks, and its metadata size
# against the floor it keeps before data (`RUNDIR/arcstats`, rewritten
# every second; each walk's seconds in $RES/walks-*.txt): whether a smaller
# ARC (UZFS_ARC_MAX) makes the walks read from disk. And the allocator
# trims that hold the RSS to its budget during the warm walks (none, and
# no misses, in a 512 MiB run: the kernel keeps the listings, and a warm
# walk asks the daemon only to open and close its 221 directories).
arcsnap() { sleep 1.1; cp "$UZFS_RUNDIR/arcstats" "$RES/arcstats-$1.txt"; }
arcv() { awk -v k="$2" '$1 == k {print $3}' "$RES/arcstats-$1.txt"; }
arcd() { echo $(( $(arcv "$2" "$3") - $(arcv "$1" "$3") )); }
arcsnap walks0
metric arc_meta_before_walks_MiB "$(( $(arcv walks0 metadata_size) >> 20 ))" MiB
metric arc_meta_floor_MiB "$(( $(arcv walks0 uzfs_meta_floor) >> 20 ))" MiB
for _ in $(seq "$REPEAT"); do walk; done > "$RES/walks-warm.txt"
spread meta_stat "$RES/walks-warm.txt"
arcsnap walks1
for _ in $(seq "$REPEAT"); do cold_ls; done > "$RES/walks-cold.txt"
spread meta_lsR_cold "$RES/walks-cold.txt"
arcsnap walks2
metric arc_meta_misses_warm_walks "$(arcd walks0 walks1 demand_metadata_misses)" ""
metric arc_meta_misses_cold_ls "$(arcd walks1 walks2 demand_metadata_misses)" ""
metric trims_warm_walks "$(arcd walks0 walks1 uzfs_malloc_trims)" ""
metric trim_ms_warm_walks "$(( $(arcd walks0 walks1 uzfs_malloc_trim_us) / 1000 ))" ms
metric trims_total "$(arcv walks2 uzfs_malloc_trims)" ""
metric trim_ms_total "$(( $(arcv walks2 uzfs_malloc_trim_us) / 1000 ))" ms
metric daemon_peak_rss_MiB "$(awk '/VmHWM/{printf "%.0f", $2/1024}' "/proc/$PID/status")" MiB
metric daemon_cpu_s "$(awk -v hz="$(getconf CLK_TCK)" '{printf "%.1f", ($14+$15)/hz}' "/proc/$PID/stat")" s
metric transport "$(transport)"
"$U" zpool status bench_uzfs > "$RES/zpool-status-end.txt"
grep -q 'errors: No known data errors' "$RES/zpool-status-end.txt" || metric FAIL_status "pool reported errors" ""
"$U" zpool export bench_uzfs
"$U" zdb -e -p "$DATA/uzfs" -b bench_uzfs > "$RES/zdb.txt" 2>&1 || metric FAIL_zdb "zdb failed" ""
grep -q 'No errors' "$RES/zdb.txt" || metric FAIL_zdb "zdb found errors (see $RES/zdb.txt)" ""
"$U" daemon --stop >/dev/null 2>&1 || true
rm -rf "$DATA/uzfs"

if [ $ONLY = 1 ]; then cat "$RES/metrics.tsv"; exit 0; fi

# ---------------------------------------------------------------- uzfs over /dev/fuse
# The create test again on a fresh pool, requests read from /dev/fuse
# (UZFS_FUSE_URING=0): what the io_uring transport is worth.
RES="$RESULTS/uzfs-devfuse"; rm -rf "$RES"; mkdir -p "$RES" "$DATA/uzfs"
truncate -s "$DISK_SIZE" "$DATA/uzfs/disk0.img" "$DATA/uzfs/disk1.img"
UZFS_FUSE_URING=0 "$U" zpool create -f -m "$M" bench_uzfs mirror "$DATA/uzfs/disk0.img" "$DATA/uzfs/disk1.img"
out=$(python3 "$LIB" create "$M/meta/tree" "$NFILES")
metric meta_create_s "${out% *}" s
metric transport "$(transport)"
"$U" zpool export bench_uzfs
"$U" daemon --stop >/dev/null 2>&1 || true
rm -rf "$DATA/uzfs"

# ---------------------------------------------------------------- FUSE floor
# The same create test on an in-memory FUSE filesystem with uzfs's mount
# options and kernel features: the round trips alone, no storage work.
FRES="$RESULTS/floor"; rm -rf "$FRES"; mkdir -p "$FRES" "$DATA/mnt/floor"
coproc FLOORFS { $FLOOR "$DATA/mnt/floor"; }
for _ in $(seq 50); do awk -v m="$DATA/mnt/floor" '$2==m{f=1} END{exit !f}' /proc/mounts && break; sleep 0.1; done
out=$(python3 "$LIB" create "$DATA/mnt/floor/tree" "$NFILES") \
  && printf 'meta_create_s\t%s\ts\n' "${out% *}" >> "$FRES/metrics.tsv" \
  || printf 'FAIL_floor\tcreate failed\t\n' >> "$FRES/metrics.tsv"
umount "$DATA/mnt/floor" 2>/dev/null || umount -l "$DATA/mnt/floor"
eval "exec ${FLOORFS[1]}>&-"; wait "$FLOORFS_PID" 2>/dev/null || true

# ---------------------------------------------------------------- report
python3 - "$RESULTS" "$SMOKE" <<'EOF' | tee "$DATA/report.md"
import os, sys
res, smoke = sys.argv[1], sys.argv[2] == "1"
def load(cfg):
    m = {}
    p = os.path.join(res, cfg, "metrics.tsv")
    if os.path.exists(p):
        for line in open(p):
            f = line.rstrip("\n").split("\t")
            if len(f) >= 2:
                m[f[0]] = f[1]
    return m
u, e, z = load("uzfs"), ({} if smoke else load("ext4")), ({} if smoke else load("zmirror"))
fl = load("floor")
ud = load("uzfs-devfuse")
rows = [
    ("seq write 1 MiB, end fsync (MiB/s)", "seqwrite_write_MiBps", True),
    ("seq read 1 MiB, cold (MiB/s)", "seqread_read_MiBps", True),
    ("4 KiB random read (IOPS)", "randread4k_read_iops", True),
    ("4 KiB write + fsync each (IOPS)", "syncwrite4k_write_iops", True),
    ("4 KiB write + fsync each, fsync p99 (us)", "syncwrite4k_fsync_p99_us", False),
    ("16 KiB buffered random write (MiB/s)", "randwrite16k_write_MiBps", True),
    ("create small files, 20k (1000 in smoke) (s)", "meta_create_s", False),
    ("stat walk (s)", "meta_stat_s", False),
    ("daemon peak RSS (MiB)", "daemon_peak_rss_MiB", False),
]
def ratio(a, b, higher):
    try:
        a, b = float(a), float(b)
    except ValueError:
        return "n/a"
    if a == 0 or b == 0:
        return "n/a"
    return f"{a / b:.2f}" if higher else f"{b / a:.2f}"
print("| workload | uzfs | ext4-loop | zfs-fuse mirror | uzfs vs ext4 | uzfs vs zfs-fuse |")
print("|---|---:|---:|---:|---:|---:|")
for label, key, higher in rows:
    uv, ev, zv = u.get(key, "n/a"), e.get(key, "n/a"), z.get(key, "n/a")
    print(f"| {label} | {uv} | {ev} | {zv} | {ratio(uv, ev, higher)} | {ratio(uv, zv, higher)} |")
print("\nRatios are 'times better' (higher is better for uzfs; times are inverted).")
print(f"\nuzfs transport: {u.get('transport', 'n/a')}. The create test over /dev/fuse on a fresh pool: "
      f"{ud.get('meta_create_s', 'n/a')} s ({ud.get('transport', 'n/a')}); vs zfs-fuse: "
      f"{ratio(ud.get('meta_create_s', 'n/a'), z.get('meta_create_s', 'n/a'), False)}")
fc = fl.get("meta_create_s", "n/a")
print(f"\nFUSE floor (in-memory FUSE filesystem, uzfs's mount options and transport, no storage work): "
      f"create {fc} s; uzfs's time / floor's = {ratio(u.get('meta_create_s', 'n/a'), fc, True)}; "
      f"the most a filesystem on this transport could beat zfs-fuse by here: {ratio(fc, z.get('meta_create_s', 'n/a'), False)} times")
fails = [f"- {c}: {k} = {v}" for c, m in (("uzfs", u), ("uzfs-devfuse", ud), ("ext4", e), ("zmirror", z), ("floor", fl)) for k, v in m.items() if k.startswith("FAIL")]
if fails:
    print("\nFailures:\n" + "\n".join(fails))
    sys.exit(1)
EOF
