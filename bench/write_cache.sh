#!/usr/bin/env bash
# What keeping written data in the ARC costs a streaming writer: a SIZE
# sequential 1 MiB write (end fsync) through a mounted mirror of two files
# on the disk, with `UZFS_ARC_CACHE_WRITES=always` (default) and `never`
# alternated on a fresh daemon each run; per run MiB/s, daemon CPU seconds
# per GiB written and the daemon's peak RSS, then medians and ranges.
#
# usage: bench/write_cache.sh [BIN] [ROUNDS]
# env: DATA [/var/tmp/uzfs-wcache]  SIZE [4G]
set -euo pipefail
U=$(realpath "${1:-target/release/uzfs}"); ROUNDS=${2:-3}
D=${DATA:-/var/tmp/uzfs-wcache}; SIZE=${SIZE:-4G}
HZ=$(getconf CLK_TCK)
export UZFS_RUNDIR="$D/run"
OUT="$D.tsv"; : > "$OUT"
one() { # mode round
  export UZFS_ARC_CACHE_WRITES=$1
  "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"; mkdir -p "$D"; truncate -s 8G "$D/d0" "$D/d1"
  "$U" zpool create -f -m "$D/mnt" wcache mirror "$D/d0" "$D/d1" >/dev/null
  local P c0 c1 hwm bw; P=$(cat "$UZFS_RUNDIR/uzfsd.pid")
  c0=$(awk -v hz="$HZ" '{print ($14 + $15) / hz}' "/proc/$P/stat")
  bw=$(fio --name=w --ioengine=psync --direct=0 --filename="$D/mnt/f" --size="$SIZE" --rw=write \
      --bs=1M --end_fsync=1 --output-format=json | python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["write"]["bw"] / 1024)')
  c1=$(awk -v hz="$HZ" '{print ($14 + $15) / hz}' "/proc/$P/stat")
  hwm=$(awk '/^VmHWM:/{print $2 / 1024}' "/proc/$P/status")
  local gib; gib=$(python3 -c "import sys; s='$SIZE'; m={'M':1/1024,'G':1}; print(float(s[:-1])*m[s[-1]])")
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$bw" "$(python3 -c "print(($c1 - $c0) / $gib)")" "$hwm" | tee -a "$OUT"
  "$U" zpool destroy wcache >/dev/null; "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"
}
for r in $(seq 1 "$ROUNDS"); do one always "$r"; one never "$r"; done
python3 - "$OUT" <<'PY'
import statistics as st, sys, collections
v = collections.defaultdict(lambda: ([], [], []))
for line in open(sys.argv[1]):
    m, _, bw, cpu, rss = line.split("\t")
    for i, x in enumerate((bw, cpu, rss)):
        v[m][i].append(float(x))
f = lambda a: f"{st.median(a):.4g} ({min(a):.4g}-{max(a):.4g})"
print("| UZFS_ARC_CACHE_WRITES | MiB/s | daemon CPU s/GiB | peak RSS MiB |")
print("|---|---:|---:|---:|")
for m, (bw, cpu, rss) in v.items():
    print(f"| {m} | {f(bw)} | {f(cpu)} | {f(rss)} |")
PY
