#!/usr/bin/env bash
# Software cost of two uzfs builds, with the disk taken out: the pool's
# files live in tmpfs (/dev/shm), and what is compared is the daemon's CPU
# seconds per GiB (per 1,000 operations for the fsync workload) beside the
# throughput, builds interleaved (before, after, ...) each on a fresh pool.
# On this VM the disk's speed moves by up to 4x between minutes, which
# hides a 5% difference in throughput; CPU time per unit of work does not
# depend on the disk.
#
# Workloads (fio through the FUSE mount): SIZE (2 GiB) sequential 1 MiB writes
# with an end fsync; the same file read back cold (the daemon's cache
# flushed by `zinject -a`, the kernel's by drop_caches); 4 KiB random
# reads of it for RUNTIME s; 4 KiB random writes with an fsync after each
# for RUNTIME s.
#
# usage: bench/cpu_ab.sh BEFORE_BIN AFTER_BIN [ROUNDS]
# env: DATA [/dev/shm/uzfs-cpuab]  RUNTIME [8]  SIZE [2G] (of the sequential file)
#      LAYOUT [mirror] (or raidz1, raidz2, ...) over NDEV [2] files of 6 GiB
#      COMPRESSIBLE [unset] (a percentage: fio's buffer_compress_percentage
#      for the sequential write, buffers refilled, so lz4 has work)
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: bench/cpu_ab.sh BEFORE_BIN AFTER_BIN [ROUNDS]" >&2; exit 2; }
A=$(realpath "$1"); B=$(realpath "$2"); ROUNDS=${3:-3}
BASE=${DATA:-/dev/shm/uzfs-cpuab}; RUNTIME=${RUNTIME:-8}; SIZE=${SIZE:-2G}
LAYOUT=${LAYOUT:-mirror}; NDEV=${NDEV:-2}
HZ=$(getconf CLK_TCK)
cpu() { # daemon pid -> CPU seconds so far
  awk -v hz="$HZ" '{print ($14 + $15) / hz}' "/proc/$1/stat"
}
one() { # binary label round
  local U=$1 L=$2 R=$3 D="$BASE/$2"
  export UZFS_RUNDIR="$D/run"
  "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"; mkdir -p "$D"
  local devs=() i
  for i in $(seq 0 $((NDEV - 1))); do truncate -s 6G "$D/d$i"; devs+=("$D/d$i"); done
  local M="$D/mnt"
  "$U" zpool create -f -m "$M" cab "$LAYOUT" "${devs[@]}" >/dev/null
  local P; P=$(cat "$UZFS_RUNDIR/uzfsd.pid")
  local c0 c1 c2 c3 c4
  c0=$(cpu "$P")
  local comp=()
  [ -n "${COMPRESSIBLE:-}" ] && comp=(--buffer_compress_percentage="$COMPRESSIBLE" --refill_buffers=1)
  fio --name=s --ioengine=psync --direct=0 --filename="$M/f" --size="$SIZE" --rw=write --bs=1M \
      "${comp[@]}" --end_fsync=1 --output-format=json --output="$D/s.json"
  c1=$(cpu "$P")
  sync; echo 3 > /proc/sys/vm/drop_caches; "$U" zinject -a cab >/dev/null
  fio --name=c --ioengine=psync --direct=0 --filename="$M/f" --size="$SIZE" --rw=read --bs=1M \
      --output-format=json --output="$D/c.json"
  c2=$(cpu "$P")
  fio --name=r --ioengine=psync --direct=0 --filename="$M/f" --size="$SIZE" --rw=randread --bs=4k \
      --runtime="$RUNTIME" --time_based=1 --output-format=json --output="$D/r.json"
  c3=$(cpu "$P")
  fio --name=w --ioengine=psync --direct=0 --filename="$M/g" --size=256M --rw=randwrite --bs=4k \
      --runtime="$RUNTIME" --time_based=1 --fsync=1 --overwrite=1 --output-format=json \
      --output="$D/w.json"
  c4=$(cpu "$P")
  local hwm; hwm=$(awk '/^VmHWM:/{print $2 / 1024}' "/proc/$P/status")
  python3 - "$D" "$L" "$R" "$c0" "$c1" "$c2" "$c3" "$c4" "$hwm" <<'PY'
import json, sys
d, l, r = sys.argv[1:4]
c = [float(x) for x in sys.argv[4:9]]
hwm = float(sys.argv[9])
j = lambda n: json.load(open(f"{d}/{n}.json"))["jobs"][0]
s, cr, rr, w = j("s")["write"], j("c")["read"], j("r")["read"], j("w")["write"]
gib = lambda x: x["io_bytes"] / 2**30
rows = [
    ("seq_write_MiBps", s["bw"] / 1024), ("seq_write_cpu_s_per_GiB", (c[1] - c[0]) / gib(s)),
    ("cold_read_MiBps", cr["bw"] / 1024), ("cold_read_cpu_s_per_GiB", (c[2] - c[1]) / gib(cr)),
    ("randread4k_iops", rr["iops"]), ("randread4k_cpu_s_per_1k_ops", (c[3] - c[2]) / rr["total_ios"] * 1000),
    ("fsync4k_iops", w["iops"]), ("fsync4k_cpu_s_per_1k_ops", (c[4] - c[3]) / w["total_ios"] * 1000),
    ("daemon_peak_rss_MiB", hwm),
]
for k, v in rows:
    print(f"{l}\t{r}\t{k}\t{v:.4f}")
PY
  "$U" zpool destroy cab >/dev/null; "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"
}
mkdir -p "$BASE"
OUT="$BASE.tsv"; : > "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  one "$A" before "$r" | tee -a "$OUT"
  one "$B" after "$r" | tee -a "$OUT"
done
# Medians, ranges and the median of the per-round ratios (after/before;
# > 1 is better: throughput up or CPU per unit down).
python3 - "$OUT" <<'PY'
import statistics as st, sys, collections
v = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    l, r, k, x = line.rstrip("\n").split("\t")
    v[k].setdefault(l, {})[int(r)] = float(x)
print("| metric | before: median (range) | after: median (range) | after/before, median of rounds |")
print("|---|---:|---:|---:|")
for k, d in v.items():
    b, a = d.get("before", {}), d.get("after", {})
    rounds = sorted(set(a) & set(b))
    cost = "cpu" in k or "rss" in k
    ratio = [(b[i] / a[i] if cost else a[i] / b[i]) for i in rounds if a[i] and b[i]]
    f = lambda m: f"{st.median(m.values()):.4g} ({min(m.values()):.4g}-{max(m.values()):.4g})"
    print(f"| {k} | {f(b)} | {f(a)} | {st.median(ratio):.2f} |")
PY
