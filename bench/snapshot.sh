#!/usr/bin/env bash
# Snapshots: uzfs (mirror of two written 4 GiB files) beside btrfs (raid1
# over two loop devices on the same kind of files), rounds interleaved.
# Per round and stack:
#   * 20,000 small files in the dataset, a writer running (fio, 16 KiB
#     buffered random writes): latency of taking a snapshot;
#   * a snapshot that alone holds SIZE of data (a file written, snapshotted,
#     then deleted): time for the destroy command to return, and until the
#     space is back (btrfs: `subvolume sync`), for two sizes;
#   * rollback of the 20,000-file dataset after 10% of its files changed
#     (btrfs: delete the subvolume, snapshot the snapshot back in place);
#   * uzfs only, against itself: 16 KiB random overwrites (fio, 15 s, end
#     fsync) of a file laid out before, and 20,000 creates, in a dataset
#     with 100 snapshots (taken between small changes, so overwrites feed
#     a dead list) and in one with none, in alternating order.
# Medians and ranges over the rounds; uzfs daemon CPU seconds and peak RSS.
#
# usage: bench/snapshot.sh [ROUNDS]   (release binary: target/release/uzfs)
# env: DATA [/var/tmp/uzfs-snapbench], SIZES ["512M 1G"], DEV_SIZE [4G]
#      (each of the four device files; SIZES must fit a mirror of two),
#      PARTS ["snap rollback many destroy"] (which measurements run),
#      SNAPS [100] (snapshots of the "many" dataset),
#      SNAP_RECORDSIZE [default 128K] (uzfs recordsize of the snapshotted
#      dataset the 16 KiB writer writes to)
set -euo pipefail
ROUNDS=${1:-3}
U=$(realpath "${UZFS_BIN:-target/release/uzfs}")
D=${DATA:-/var/tmp/uzfs-snapbench}
SIZES=${SIZES:-"512M 1G"}
DEV_SIZE=${DEV_SIZE:-4G}
PARTS=${PARTS:-"snap rollback many destroy"}
SNAPS=${SNAPS:-100}
part() { [[ " $PARTS " == *" $1 "* ]]; }
export UZFS_RUNDIR=$D/run UZFS_LOG=${UZFS_LOG:-info}
. "$(dirname "$0")/lib.sh"
command -v mkfs.btrfs >/dev/null || apt-get install -y -q btrfs-progs >/dev/null
command -v fio >/dev/null || apt-get install -y -q fio >/dev/null
mkdir -p "$D"
written_files "$DEV_SIZE" "$D/u0" "$D/u1" "$D/b0" "$D/b1"
OUT=$D/results.tsv; : > "$OUT"
now() { date +%s.%N; }
el() { python3 -c "print(f'{$2 - $1:.3f}')"; }
rec() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$OUT"; echo "$1 $2 $3"; }
mkfiles() { python3 - "$1" <<'PY'
import os, sys
d = sys.argv[1]
for i in range(200):
    sub = os.path.join(d, f"d{i}")
    os.makedirs(sub, exist_ok=True)
    for j in range(100):
        with open(os.path.join(sub, f"f{j}"), "wb") as f:
            f.write(os.urandom(1024))
PY
}
# Rewrite 10% of mkfiles' files (20 of its 200 directories).
change10() { python3 - "$1" <<'PY'
import os, sys
d = sys.argv[1]
for i in range(0, 200, 10):
    for j in range(100):
        with open(os.path.join(d, f"d{i}", f"f{j}"), "wb") as f:
            f.write(os.urandom(1024))
PY
}
# 16 KiB random overwrites of a laid-out 256 MiB file for 15 s: IOPS.
randw() { fio --name=r --directory="$1" --rw=randwrite --bs=16k --size=256M \
  --time_based=1 --runtime=15 --end_fsync=1 --overwrite=1 --output-format=json 2>/dev/null |
  python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["write"]["iops"]))'; }
layout() { fio --name=r --directory="$1" --rw=write --bs=1M --size=256M --create_only=1 \
  --overwrite=1 --output=/dev/null >/dev/null 2>&1; }
writer() { fio --name=w --directory="$1" --rw=randwrite --bs=16k --size=256M \
  --time_based=1 --runtime=600 --output=/dev/null >/dev/null 2>&1 & echo $!; }
LOOPS=()
# fio's job runs in a child: stop both before unmounting.
stop_writer() {
  [ -n "${WP:-}" ] || return 0
  kill "$WP" 2>/dev/null || true
  pkill -f 'fio --name=w ' 2>/dev/null || true
  wait "$WP" 2>/dev/null || true
  WP=
  sleep 1
}
cleanup() {
  stop_writer
  "$U" zpool destroy sb >/dev/null 2>&1 || true
  "$U" daemon --stop >/dev/null 2>&1 || true
  umount "$D/bmnt" 2>/dev/null || true
  for l in "${LOOPS[@]}"; do losetup -d "$l" 2>/dev/null || true; done
  LOOPS=()
}
trap cleanup EXIT
cleanup

round_uzfs() {
  "$U" zpool create -f -m "$D/umnt" sb mirror "$D/u0" "$D/u1" >/dev/null
  local pid; pid=$(cat "$D/run/uzfsd.pid")
  local t0 t1
  if part snap || part rollback; then
  "$U" zfs create ${SNAP_RECORDSIZE:+-o recordsize=$SNAP_RECORDSIZE} sb/meta
  mkfiles "$D/umnt/meta"
  "$U" zpool sync sb
  fi
  if part snap; then
  WP=$(writer "$D/umnt/meta"); sleep 5
  t0=$(now); "$U" zfs snapshot sb/meta@s1; t1=$(now)
  rec uzfs snapshot_20k_files_s "$(el "$t0" "$t1")"
  stop_writer
  fi
  if part rollback; then
  "$U" zfs snapshot sb/meta@r0
  change10 "$D/umnt/meta"; "$U" zpool sync sb
  t0=$(now); "$U" zfs rollback sb/meta@r0; t1=$(now)
  rec uzfs rollback_20k_files_10pct_s "$(el "$t0" "$t1")"
  fi
  if part many; then
  # 100 snapshots against none, alternating which goes first.
  local order="none snap100"; [ $((RANDOM % 2)) = 0 ] && order="snap100 none"
  for x in none snap100; do
    "$U" zfs create "sb/$x"; layout "$D/umnt/$x"; "$U" zpool sync sb
  done
  t0=$(now)
  for i in $(seq "$SNAPS"); do
    head -c 4096 /dev/urandom > "$D/umnt/snap100/small"
    "$U" zfs snapshot "sb/snap100@p$i"
  done
  t1=$(now)
  rec uzfs "snapshot_each_of_${SNAPS}_s" "$(python3 -c "print(f'{($t1 - $t0) / $SNAPS:.4f}')")"
  t0=$(now); "$U" zfs list -t all -r sb >/dev/null; t1=$(now)
  rec uzfs "zfs_list_all_${SNAPS}_snaps_s" "$(el "$t0" "$t1")"
  for x in $order; do
    rec uzfs "randwrite16k_iops_$x" "$(randw "$D/umnt/$x")"
    mkdir -p "$D/umnt/$x/c"
    t0=$(now); mkfiles "$D/umnt/$x/c"; sync -f "$D/umnt/$x"; t1=$(now)
    rec uzfs "creates_20k_s_$x" "$(el "$t0" "$t1")"
  done
  fi
  part destroy && for sz in $SIZES; do
    "$U" zfs create "sb/big$sz"
    dd if=/dev/urandom of="$D/umnt/big$sz/f" bs=4M count=$(( $(numfmt --from=iec "$sz") >> 22 )) status=none
    "$U" zfs snapshot "sb/big$sz@held"
    rm "$D/umnt/big$sz/f"; "$U" zpool sync sb
    t0=$(now); "$U" zfs destroy "sb/big$sz@held"; t1=$(now)
    rec uzfs "destroy_${sz}_return_s" "$(el "$t0" "$t1")"
    "$U" zpool wait -t free sb; "$U" zpool sync sb; t1=$(now)
    rec uzfs "destroy_${sz}_freed_s" "$(el "$t0" "$t1")"
  done
  rec uzfs daemon_cpu_s "$(awk -v t="$(getconf CLK_TCK)" '{printf "%.1f", ($14+$15)/t}' "/proc/$pid/stat")"
  rec uzfs daemon_peak_rss_mib "$(awk '/VmHWM/ {printf "%d", $2/1024}' "/proc/$pid/status")"
  "$U" zpool destroy sb >/dev/null
  "$U" daemon --stop >/dev/null
}

round_btrfs() {
  local l0 l1
  l0=$(losetup -f --show "$D/b0"); l1=$(losetup -f --show "$D/b1"); LOOPS=("$l0" "$l1")
  mkfs.btrfs -q -f -d raid1 -m raid1 "$l0" "$l1"
  mkdir -p "$D/bmnt"; mount "$l0" "$D/bmnt"
  local t0 t1
  if part snap || part rollback; then
  btrfs subvolume create "$D/bmnt/meta" >/dev/null
  mkfiles "$D/bmnt/meta"; sync -f "$D/bmnt"
  fi
  if part snap; then
  WP=$(writer "$D/bmnt/meta"); sleep 5
  t0=$(now); btrfs subvolume snapshot -r "$D/bmnt/meta" "$D/bmnt/meta@s1" >/dev/null; t1=$(now)
  rec btrfs snapshot_20k_files_s "$(el "$t0" "$t1")"
  stop_writer
  fi
  if part rollback; then
  btrfs subvolume snapshot -r "$D/bmnt/meta" "$D/bmnt/meta@r0" >/dev/null
  change10 "$D/bmnt/meta"; sync -f "$D/bmnt"
  t0=$(now)
  btrfs subvolume delete "$D/bmnt/meta" >/dev/null
  btrfs subvolume snapshot "$D/bmnt/meta@r0" "$D/bmnt/meta" >/dev/null
  sync -f "$D/bmnt"; t1=$(now)
  rec btrfs rollback_20k_files_10pct_s "$(el "$t0" "$t1")"
  fi
  part destroy && for sz in $SIZES; do
    btrfs subvolume create "$D/bmnt/big$sz" >/dev/null
    dd if=/dev/urandom of="$D/bmnt/big$sz/f" bs=4M count=$(( $(numfmt --from=iec "$sz") >> 22 )) status=none
    btrfs subvolume snapshot -r "$D/bmnt/big$sz" "$D/bmnt/big$sz@held" >/dev/null
    rm "$D/bmnt/big$sz/f"; sync -f "$D/bmnt"
    t0=$(now); btrfs subvolume delete "$D/bmnt/big$sz@held" >/dev/null; t1=$(now)
    rec btrfs "destroy_${sz}_return_s" "$(el "$t0" "$t1")"
    btrfs subvolume sync "$D/bmnt" >/dev/null; sync -f "$D/bmnt"; t1=$(now)
    rec btrfs "destroy_${sz}_freed_s" "$(el "$t0" "$t1")"
  done
  cleanup
}

for r in $(seq "$ROUNDS"); do
  echo "== round $r"
  round_uzfs
  round_btrfs
done
python3 - "$OUT" <<'PY'
import sys, statistics
from collections import defaultdict
v = defaultdict(list)
for line in open(sys.argv[1]):
    stack, metric, val = line.rstrip("\n").split("\t")
    v[(metric, stack)].append(float(val))
metrics = sorted({m for m, _ in v})
print("\n| metric | uzfs median (min-max) | btrfs median (min-max) | uzfs / btrfs |")
print("|---|---|---|---|")
for m in metrics:
    cells, med = [], {}
    for s in ("uzfs", "btrfs"):
        x = v.get((m, s))
        if x:
            med[s] = statistics.median(x)
            cells.append(f"{med[s]:.3f} ({min(x):.3f}-{max(x):.3f})")
        else:
            cells.append("-")
    ratio = f"{med['uzfs'] / med['btrfs']:.2f}" if len(med) == 2 and med["btrfs"] else "-"
    print(f"| {m} | {cells[0]} | {cells[1]} | {ratio} |")
PY
