#!/usr/bin/env bash
# How long the kernel keeps what a listing told it (issue #16, point 6):
# one uzfs build mounted twice, A with UZFS_FUSE_TTL=1 (names and
# attributes kept 1 s, no directory listing kept: the behaviour before)
# and B with the default (an hour, listings kept), each a file-backed pool
# with NFILES small files. Rounds interleave A and B; each round drops
# every cache, then times `ls -lR` cold, at once again (warm), and after
# 2 s (the 1 s entries of A have expired by then). Prints medians and
# ranges, and B/A.
#
# usage: bench/ls_warm.sh [ROUNDS]   env: UZFS_BIN [target/release/uzfs]
#        NFILES [20000]  DATA [/var/tmp/uzfs-lswarm]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench/ls_warm.sh: must run as root" >&2; exit 1; }
ROUNDS=${1:-5}
U=$(realpath "${UZFS_BIN:-target/release/uzfs}")
D=${DATA:-/var/tmp/uzfs-lswarm}
NFILES=${NFILES:-20000}
LIB=$(pwd)/bench/fslib.py
stop() {
  for s in A B; do UZFS_RUNDIR=$D/$s/run "$U" daemon --stop >/dev/null 2>&1 || true; done
}
stop
trap stop EXIT
rm -rf "$D"; mkdir -p "$D/A" "$D/B"
for s in A B; do
  ttl=3600; [ $s = A ] && ttl=1
  truncate -s 4G "$D/$s/disk.img"
  UZFS_FUSE_TTL=$ttl UZFS_RUNDIR=$D/$s/run "$U" zpool create -f -m "$D/mnt/$s" "lsw$s" "$D/$s/disk.img"
  python3 "$LIB" create "$D/mnt/$s/tree" "$NFILES" >/dev/null
done
sync
now() { echo "$EPOCHREALTIME"; }
el() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", b-a}'; }
OUT=$D/ls.tsv; : > "$OUT"
for r in $(seq "$ROUNDS"); do
  for s in A B; do
    sync; echo 3 > /proc/sys/vm/drop_caches
    t0=$(now); ls -lR "$D/mnt/$s/tree" >/dev/null; t1=$(now)
    ls -lR "$D/mnt/$s/tree" >/dev/null; t2=$(now)
    sleep 2
    t3=$(now); ls -lR "$D/mnt/$s/tree" >/dev/null; t4=$(now)
    printf '%s\tcold\t%s\n%s\twarm\t%s\n%s\tafter 2 s\t%s\n' \
      "$s" "$(el "$t0" "$t1")" "$s" "$(el "$t1" "$t2")" "$s" "$(el "$t3" "$t4")" >> "$OUT"
  done
done
python3 - "$OUT" "$NFILES" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
print(f"| ls -lR of {sys.argv[2]} files (s) | A: 1 s, no listings kept | B: default | B/A |")
print("|---|---|---|---|")
for m in ("cold", "warm", "after 2 s"):
    v = {s: sorted(float(x) for a, b, x in rows if a == s and b == m) for s in "AB"}
    med = {s: statistics.median(v[s]) for s in "AB"}
    cell = lambda s: f"{med[s]:.3f} ({v[s][0]:.3f}-{v[s][-1]:.3f})"
    print(f"| {m} | {cell('A')} | {cell('B')} | {med['B'] / med['A']:.2f} |")
PY
