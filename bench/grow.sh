#!/usr/bin/env bash
# Growing a pool whose devices grew (issue #13), uzfs beside zfs-fuse and
# ext4-on-loop in one run, rounds interleaved (uzfs, zfs-fuse, ext4, ...):
#
#   a mirror of two START-sized file vdevs (ext4: one loop device) holding
#   FILL_MB of data; the files enlarged to END; then the grow command:
#     uzfs      zpool online -e POOL A B
#     zfs-fuse  zpool set autoexpand=on; export; import (its own daemon,
#               private mount ns; its `online -e` does not see file vdevs
#               grow: checked, the size stays)
#     ext4      losetup -c DEV; resize2fs DEV online, or where that is
#               refused (a container without CAP_SYS_RESOURCE, as this VM)
#               offline: umount; e2fsck -fp; resize2fs; mount
#   and WRITE_MB written into the grown filesystem (dd 1 MiB, fsync at end).
#
# Reported per stack: the grow command's wall time, the filesystem size
# (df) before and after, the write's MiB/s, the daemon's CPU seconds per GiB
# written and its peak RSS (ext4: kernel, not measured), as medians with
# [min-max] over ROUNDS rounds, and uzfs ÷ peer ratios of the medians.
#
# usage: bench/grow.sh [--smoke]
# env: DATA [/var/tmp/uzfs-bench]  ROUNDS [3]  START [512M]  END [1G]
#      FILL_MB [256]  WRITE_MB [512]   (--smoke: 1 round, 128M -> 256M)
# Output: markdown on stdout and in $DATA/grow.md. Needs root (loop, FUSE).
set -euo pipefail
cd "$(dirname "$0")/.."
SMOKE=0
for a in "$@"; do
  case "$a" in
    --smoke) SMOKE=1 ;;
    *) echo "usage: bench/grow.sh [--smoke]" >&2; exit 2 ;;
  esac
done
DATA=${DATA:-/var/tmp/uzfs-bench}
if [ $SMOKE = 1 ]; then
  ROUNDS=${ROUNDS:-1}; START=${START:-128M}; END=${END:-256M}
  FILL_MB=${FILL_MB:-32}; WRITE_MB=${WRITE_MB:-64}
else
  ROUNDS=${ROUNDS:-3}; START=${START:-512M}; END=${END:-1G}
  FILL_MB=${FILL_MB:-256}; WRITE_MB=${WRITE_MB:-512}
fi
cargo build --release --bins -q
U=$PWD/target/release/uzfs
W="$DATA/grow"
REPORT="$DATA/grow.md"
TSV="$W/runs.tsv"
rm -rf "$W"; mkdir -p "$W"
: > "$REPORT"
out() { echo "$*" | tee -a "$REPORT"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", b-a}'; }
cpu_of() { awk -v t="$(getconf CLK_TCK)" '{printf "%.3f", ($14+$15)/t}' "/proc/$1/stat"; }
rss_of() { awk '/VmHWM/{printf "%.0f", $2/1024}' "/proc/$1/status"; }
dfsize() { df -B1 --output=size "$1" | tail -1 | tr -d ' '; }
HAVE_ZFS_FUSE=1
command -v zfs-fuse >/dev/null || HAVE_ZFS_FUSE=0
# The smoke run (CI) checks the uzfs and ext4 paths only.
[ $SMOKE = 1 ] && [ "${GROW_PEERS:-0}" != 1 ] && HAVE_ZFS_FUSE=0

# One measured write of WRITE_MB into $1 (run through "$2" for zfs-fuse's
# namespace); prints MiB/s.
write_mbs() {
  local dir=$1; shift
  local t0 t1
  t0=$(now)
  if ! "$@" dd if=/dev/zero of="$dir/after" bs=1M count="$WRITE_MB" conv=fsync status=none; then
    echo "fail"
    return
  fi
  t1=$(now)
  awk -v m="$WRITE_MB" -v s="$(secs "$t0" "$t1")" 'BEGIN{printf "%.1f", m/s}'
}

# stack round grow_s size_before size_after mbs cpu_s_per_gib rss_mib
row() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$TSV"; }

run_uzfs() {
  local r=$1 d="$W/uzfs$1"
  mkdir -p "$d/mnt"
  export UZFS_RUNDIR="$d/run"
  truncate -s "$START" "$d/a" "$d/b"
  "$U" zpool create -m "$d/mnt/gbench" gbench mirror "$d/a" "$d/b"
  local pid; pid=$(cat "$d/run/uzfsd.pid")
  dd if=/dev/urandom of="$d/mnt/gbench/fill" bs=1M count="$FILL_MB" conv=fsync status=none
  local before; before=$(dfsize "$d/mnt/gbench")
  truncate -s "$END" "$d/a" "$d/b"
  local t0 t1; t0=$(now)
  "$U" zpool online -e gbench "$d/a" "$d/b"
  t1=$(now)
  local after; after=$(dfsize "$d/mnt/gbench")
  local c0; c0=$(cpu_of "$pid")
  local mbs; mbs=$(write_mbs "$d/mnt/gbench")
  local c1; c1=$(cpu_of "$pid")
  local rss; rss=$(rss_of "$pid")
  "$U" zpool export gbench
  "$U" zdb -e -p "$d" -b gbench > "$d/zdb.txt" 2>&1 || { echo "zdb found damage: $d/zdb.txt" >&2; exit 1; }
  kill "$pid" 2>/dev/null || true
  row uzfs "$r" "$(secs "$t0" "$t1")" "$before" "$after" "$mbs" \
    "$(awk -v c="$(secs "$c0" "$c1")" -v m="$WRITE_MB" 'BEGIN{printf "%.2f", c*1024/m}')" "$rss"
  rm -rf "$d"
}

run_zfs_fuse() {
  local r=$1 d="$W/zfuse$1"
  mkdir -p "$d/ns/run" "$d/ns/lock" "$d/ns/lib" "$d/mnt" /run/zfs /run/lock/zfs /var/lib/zfs
  unshare -m --propagation private bash -c "
    mount --bind '$d/ns/run' /run/zfs &&
    mount --bind '$d/ns/lock' /run/lock/zfs &&
    mount --bind '$d/ns/lib' /var/lib/zfs &&
    exec zfs-fuse -p '$d/ns/pid' --no-kstat-mount"
  local pid=""
  for _ in $(seq 50); do [ -s "$d/ns/pid" ] && [ -S "$d/ns/run/zfs_socket" ] && break; sleep 0.2; done
  pid=$(cat "$d/ns/pid")
  local ns=(nsenter -t "$pid" -m --)
  for _ in $(seq 50); do "${ns[@]}" zpool list >/dev/null 2>&1 && break; sleep 0.2; done
  truncate -s "$START" "$d/a" "$d/b"
  "${ns[@]}" zpool create -m "$d/mnt/gbench" gbench mirror "$d/a" "$d/b"
  "${ns[@]}" dd if=/dev/urandom of="$d/mnt/gbench/fill" bs=1M count="$FILL_MB" conv=fsync status=none
  local before; before=$("${ns[@]}" df -B1 --output=size "$d/mnt/gbench" | tail -1 | tr -d ' ')
  truncate -s "$END" "$d/a" "$d/b"
  local t0 t1; t0=$(now)
  "${ns[@]}" zpool online -e gbench "$d/a" "$d/b"
  local same; same=$("${ns[@]}" df -B1 --output=size "$d/mnt/gbench" | tail -1 | tr -d ' ')
  if [ "$same" = "$before" ]; then
    "${ns[@]}" zpool set autoexpand=on gbench
    "${ns[@]}" zpool export gbench
    "${ns[@]}" zpool import -d "$d" gbench
  fi
  t1=$(now)
  local after; after=$("${ns[@]}" df -B1 --output=size "$d/mnt/gbench" | tail -1 | tr -d ' ')
  local c0; c0=$(cpu_of "$pid")
  local mbs; mbs=$(write_mbs "$d/mnt/gbench" "${ns[@]}")
  local c1; c1=$(cpu_of "$pid")
  local rss; rss=$(rss_of "$pid")
  "${ns[@]}" zpool destroy gbench || true
  kill "$pid"; for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
  row zfs-fuse "$r" "$(secs "$t0" "$t1")" "$before" "$after" "$mbs" \
    "$(awk -v c="$(secs "$c0" "$c1")" -v m="$WRITE_MB" 'BEGIN{printf "%.2f", c*1024/m}')" "$rss"
  rm -rf "$d"
}

run_ext4() {
  local r=$1 d="$W/ext4$1"
  mkdir -p "$d/mnt"
  truncate -s "$START" "$d/e"
  local dev; dev=$(losetup -f --show "$d/e")
  mkfs.ext4 -q "$dev"
  mount "$dev" "$d/mnt"
  dd if=/dev/urandom of="$d/mnt/fill" bs=1M count="$FILL_MB" conv=fsync status=none
  local before; before=$(dfsize "$d/mnt")
  truncate -s "$END" "$d/e"
  local t0 t1; t0=$(now)
  losetup -c "$dev"
  if ! resize2fs "$dev" >/dev/null 2>&1; then
    umount "$d/mnt"
    e2fsck -fp "$dev" >/dev/null
    resize2fs "$dev" >/dev/null 2>&1
    mount "$dev" "$d/mnt"
  fi
  t1=$(now)
  local after; after=$(dfsize "$d/mnt")
  local mbs; mbs=$(write_mbs "$d/mnt")
  umount "$d/mnt"
  losetup -d "$dev"
  row ext4 "$r" "$(secs "$t0" "$t1")" "$before" "$after" "$mbs" "n/a" "n/a"
  rm -rf "$d"
}

for r in $(seq 1 "$ROUNDS"); do
  run_uzfs "$r"
  [ $HAVE_ZFS_FUSE = 1 ] && run_zfs_fuse "$r"
  run_ext4 "$r"
done

out "# Growing a pool whose devices grew"
out ""
out "$(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, DATA on $(df --output=fstype "$DATA" | tail -1); command: bench/grow.sh $*"
out ""
out "Mirror of two $START file vdevs (ext4: one loop device) holding $FILL_MB MiB, files grown to $END, then the grow command and $WRITE_MB MiB written into the grown filesystem; $ROUNDS rounds, interleaved; median [min-max]."
out ""
python3 - "$TSV" "$HAVE_ZFS_FUSE" <<'EOF' | tee -a "$REPORT"
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
stacks = ["uzfs"] + (["zfs-fuse"] if sys.argv[2] == "1" else []) + ["ext4"]
cols = [("grow command (s)", 2), ("size before (MiB)", 3), ("size after (MiB)", 4),
        ("write after (MiB/s)", 5), ("daemon CPU s/GiB", 6), ("peak RSS (MiB)", 7)]
def num(x):
    try:
        return float(x)
    except ValueError:
        return None
def vals(s, i):
    f = [num(r[i]) for r in rows if r[0] == s]
    f = [x for x in f if x is not None]
    if i in (3, 4):
        f = [x / 2**20 for x in f]
    return f
def cell(f):
    if not f:
        return "n/a"
    m = statistics.median(f)
    return f"{m:.3g} [{min(f):.3g}-{max(f):.3g}]" if len(f) > 1 else f"{m:.3g}"
print("| measure | " + " | ".join(stacks) + " | " + " | ".join(f"uzfs ÷ {s}" for s in stacks[1:]) + " |")
print("|---" * (1 + len(stacks) + len(stacks) - 1) + "|")
for name, i in cols:
    cells = [cell(vals(s, i)) for s in stacks]
    u = vals("uzfs", i)
    ratios = []
    for s in stacks[1:]:
        p = vals(s, i)
        ratios.append(f"{statistics.median(u) / statistics.median(p):.2f}" if u and p and statistics.median(p) else "n/a")
    print(f"| {name} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
for s in stacks:
    failed = [r[1] for r in rows if r[0] == s and r[5] == "fail"]
    if failed:
        print(f"\n{s}: the write after growing failed (ENOSPC: the pool did not grow) in round(s) {', '.join(failed)}; medians are of the other rounds.")
EOF
out ""
out "Per-round figures: $TSV"
