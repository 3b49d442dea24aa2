#!/usr/bin/env bash
# A scrub's software cost for two builds: a mirror of two files on the
# disk (so the scan's reads take the direct-I/O path), SIZE of data
# written, both caches dropped, then a scrub; per run the scrub's MiB/s
# and the daemon's CPU seconds per GiB scrubbed (which does not depend on
# the disk's speed), builds interleaved on a fresh pool each run.
#
# usage: bench/scrub_cpu.sh BEFORE_BIN AFTER_BIN [ROUNDS]
# env: DATA [/var/tmp/uzfs-scrubcpu]  SIZE [2G]
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: bench/scrub_cpu.sh BEFORE_BIN AFTER_BIN [ROUNDS]" >&2; exit 2; }
A=$(realpath "$1"); B=$(realpath "$2"); ROUNDS=${3:-3}
D=${DATA:-/var/tmp/uzfs-scrubcpu}; SIZE=${SIZE:-2G}
HZ=$(getconf CLK_TCK)
export UZFS_RUNDIR="$D/run"
OUT="$D.tsv"; : > "$OUT"
one() { # label bin round
  local U=$2
  "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"; mkdir -p "$D"; truncate -s 8G "$D/d0" "$D/d1"
  "$U" zpool create -f -m "$D/mnt" scpu mirror "$D/d0" "$D/d1" >/dev/null
  fio --name=w --ioengine=psync --filename="$D/mnt/f" --size="$SIZE" --rw=write --bs=1M \
      --end_fsync=1 >/dev/null
  "$U" zinject -a scpu >/dev/null; sync; echo 3 > /proc/sys/vm/drop_caches
  local P c0 c1 t0 t1; P=$(cat "$UZFS_RUNDIR/uzfsd.pid")
  c0=$(awk -v hz="$HZ" '{print ($14 + $15) / hz}' "/proc/$P/stat"); t0=$(date +%s.%N)
  "$U" zpool scrub -w scpu
  t1=$(date +%s.%N); c1=$(awk -v hz="$HZ" '{print ($14 + $15) / hz}' "/proc/$P/stat")
  local gib; gib=$(python3 -c "s='$SIZE'; m={'M':1/1024,'G':1}; print(float(s[:-1])*m[s[-1]])")
  printf '%s\t%s\t%s\t%s\n' "$1" "$3" "$(python3 -c "print($gib * 1024 / ($t1 - $t0))")" \
    "$(python3 -c "print(($c1 - $c0) / $gib)")" | tee -a "$OUT"
  "$U" zpool destroy scpu >/dev/null; "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"
}
for r in $(seq 1 "$ROUNDS"); do one before "$A" "$r"; one after "$B" "$r"; done
python3 - "$OUT" <<'PY'
import statistics as st, sys, collections
v = collections.defaultdict(lambda: ([], []))
for line in open(sys.argv[1]):
    m, _, mibs, cpu = line.rstrip("\n").split("\t")
    v[m][0].append(float(mibs)); v[m][1].append(float(cpu))
f = lambda a: f"{st.median(a):.4g} ({min(a):.4g}-{max(a):.4g})"
print("| build | scrub MiB/s | daemon CPU s per GiB scrubbed |")
print("|---|---:|---:|")
for m in ("before", "after"):
    print(f"| {m} | {f(v[m][0])} | {f(v[m][1])} |")
PY
