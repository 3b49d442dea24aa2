#!/usr/bin/env bash
# bench/fs.sh's metadata test alone, two builds interleaved on fresh pools
# (a mirror of two files): create NFILES small files (bench/fslib.py),
# sync, drop the caches (drop_caches, `zinject -a`), then a cold `ls -lR`,
# an lstat walk and a warm `ls -lR`. For metadata figures that move in
# bench/before_after.sh, to see whether they move without the rest of
# fs.sh's sequence around them. With WALKS=N, N more warm lstat walks
# after those, printed sorted (the vCPUs' speed moves from one walk to the
# next: compare the medians).
#
# usage: bench/meta_ab.sh BEFORE_BIN AFTER_BIN [ROUNDS]
# env: DATA [/var/tmp/uzfs-meta]  NFILES [20000]  WALKS [0]
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "bench/meta_ab.sh: must run as root" >&2; exit 1; }
[ $# -ge 2 ] || { echo "usage: bench/meta_ab.sh BEFORE_BIN AFTER_BIN [ROUNDS]" >&2; exit 2; }
A=$(realpath "$1"); B=$(realpath "$2"); ROUNDS=${3:-3}
D=${DATA:-/var/tmp/uzfs-meta}; NFILES=${NFILES:-20000}
LIB=$(cd "$(dirname "$0")" && pwd)/fslib.py
export UZFS_RUNDIR="$D/run"
one() { # binary label
  local U=$1 L=$2 out s t0 t1 t2 t3
  "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"; mkdir -p "$D"; truncate -s 8G "$D/d0" "$D/d1"
  "$U" zpool create -f -m "$D/mnt" mab mirror "$D/d0" "$D/d1" >/dev/null
  out=$(python3 "$LIB" create "$D/mnt/meta/tree" "$NFILES")
  sync; echo 3 > /proc/sys/vm/drop_caches; "$U" zinject -a mab
  t0=$EPOCHREALTIME; ls -lR "$D/mnt/meta/tree" > /dev/null; t1=$EPOCHREALTIME
  s=$(python3 "$LIB" stat-walk "$D/mnt/meta/tree")
  t2=$EPOCHREALTIME; ls -lR "$D/mnt/meta/tree" > /dev/null; t3=$EPOCHREALTIME
  awk -v l="$L" -v c="${out% *}" -v a="$t0" -v b="$t1" -v s="${s% *}" -v x="$t2" -v y="$t3" \
    'BEGIN { printf "%s create_s=%s lsR_cold_s=%.3f stat_walk_s=%s lsR_warm_s=%.3f\n", l, c, b - a, s, y - x }'
  if [ "${WALKS:-0}" -gt 0 ]; then
    echo "$L warm_walks_s=$(for _ in $(seq "$WALKS"); do python3 "$LIB" stat-walk "$D/mnt/meta/tree" | cut -d' ' -f1; done | sort -n | tr '\n' ' ')"
  fi
  "$U" zpool destroy mab; "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"
}
for _ in $(seq "$ROUNDS"); do one "$A" before; one "$B" after; done
