#!/usr/bin/env bash
# Many snapshots, two builds against each other: on a pool file in tmpfs
# (no disk, so the figures are the software's), N snapshots of one dataset
# taken one command at a time with 4 KiB written between them, then one
# `zfs list -t all -r` of them all. Builds alternate per round (A, B, B, A,
# ...). Prints per build the median and range of the time per snapshot over
# the last 10% taken (where a per-snapshot cost that grows with the count
# shows) and of the list, and the daemon's CPU seconds.
#
# usage: bench/snapshot_scale.sh A_BIN B_BIN [ROUNDS] [N]   (defaults 3, 2000)
# env: DATA [/dev/shm/uzfs-snapscale] (must hold a 2 GiB pool file)
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: bench/snapshot_scale.sh A_BIN B_BIN [ROUNDS] [N]" >&2; exit 2; }
A=$(realpath "$1"); B=$(realpath "$2"); ROUNDS=${3:-3}; N=${4:-2000}
D=${DATA:-/dev/shm/uzfs-snapscale}
OUT=$(mktemp)
now() { date +%s.%N; }
one() { # label binary
  local label=$1 U=$2 t0 t1 t2 t3 tail=$((N / 10)) pid cpu
  rm -rf "$D"; mkdir -p "$D"
  export UZFS_RUNDIR=$D/run
  truncate -s 2G "$D/d0"
  "$U" zpool create -m "$D/mnt" sb "$D/d0" >/dev/null
  "$U" zfs create sb/x
  for i in $(seq $((N - tail))); do
    head -c 4096 /dev/urandom > "$D/mnt/x/small"
    "$U" zfs snapshot "sb/x@p$i"
  done
  t0=$(now)
  for i in $(seq $((N - tail + 1)) "$N"); do
    head -c 4096 /dev/urandom > "$D/mnt/x/small"
    "$U" zfs snapshot "sb/x@p$i"
  done
  t1=$(now)
  t2=$(now); "$U" zfs list -t all -r sb >/dev/null; t3=$(now)
  pid=$(pgrep -f "$U --rundir $D/run" | head -1)
  cpu=$(awk '{print ($14 + $15) / 100}' "/proc/$pid/stat")
  python3 -c "print('$label\tsnapshot_last10pct_ms\t' + f'{($t1 - $t0) * 1000 / $tail:.2f}')" >> "$OUT"
  python3 -c "print('$label\tlist_s\t' + f'{$t3 - $t2:.3f}')" >> "$OUT"
  printf '%s\tdaemon_cpu_s\t%s\n' "$label" "$cpu" >> "$OUT"
  "$U" zpool destroy sb
  kill "$pid" 2>/dev/null || true
  sleep 1
  rm -rf "$D"
}
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for l in $order; do
    bin=$A; [ "$l" = B ] && bin=$B
    echo "round $r: $l" >&2
    one "$l" "$bin"
  done
done
python3 - "$OUT" "$N" <<'PY'
import sys, statistics as st
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
metrics = sorted({m for _, m, _ in rows})
print(f"{sys.argv[2]} snapshots; median (min-max) per build, B/A")
for m in metrics:
    v = {l: [float(x) for ll, mm, x in rows if ll == l and mm == m] for l in "AB"}
    a, b = st.median(v["A"]), st.median(v["B"])
    ratio = b / a if a else float("nan")
    print(f"{m}\tA {a:g} ({min(v['A']):g}-{max(v['A']):g})\tB {b:g} ({min(v['B']):g}-{max(v['B']):g})\tB/A {ratio:.2f}")
PY
rm -f "$OUT"
