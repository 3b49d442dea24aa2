#!/usr/bin/env bash
# The ARC's replacement policy against another build's (for example the LRU
# before it), builds interleaved (A, B, A, B, ...), each round on a fresh
# single-file pool with a small cache (UZFS_ARC_MAX, default 512 MiB).
# Reads that must reach the daemon use O_DIRECT through the mount (the
# kernel's page cache above FUSE would otherwise answer repeats).
#
#  1. scan resistance: a 256 MiB hot file read three times (4 KiB random
#     reads, O_DIRECT), then its hit ratio measured (one more pass); then a
#     4 GiB file read sequentially once (1 MiB, buffered, as `cp` would);
#     then the hot file's hit ratio again.
#  2. Zipf: 4 KiB random reads, fio `random_distribution=zipf:1.2`, O_DIRECT,
#     over a file twice the cache, RUNTIME s: IOPS and hit ratio.
#     With L2=B (or A, or AB) that build's pool has a cache device (a file
#     of L2_SIZE, default twice the cache, beside the pool's): its l2 hit
#     ratio over the Zipf run (L2ARC hits / lookups after an ARC miss) and
#     what it held at the end are printed too. Both builds may be the same
#     binary: then A/B is without/with the cache device.
#  3. (EXT4=1) the same Zipf reads on ext4 on a loop device (direct I/O to
#     its backing file, so the host caches nothing under it), buffered, with
#     fio in a memory cgroup limited to the cache size plus 64 MiB: the page
#     cache gets the memory the ARC gets. Hit ratio = 1 - bytes the loop
#     device read / bytes fio read.
#
# Hit ratio = 1 - cache misses / reads issued, the misses from the
# daemon's own counters (`arcstat --snapshot` over its socket, which every
# build since the LRU answers). The hot passes read whole 128 KiB records
# (one cache lookup of data each), the Zipf run 4 KiB pieces of them.
# Device bytes cannot serve as the measure: the pool's reads are buffered,
# so the host's page cache under a file vdev answers many misses.
# Also printed: daemon CPU seconds and peak RSS per round.
#
# usage: bench/arc.sh A_BIN B_BIN [ROUNDS]
# env: DATA [/var/tmp/uzfs-arcbench]  ARC [512M]  RUNTIME [20]  EXT4 [0]
#      L2 [none]  L2_SIZE [2 x ARC]
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: bench/arc.sh A_BIN B_BIN [ROUNDS]" >&2; exit 2; }
A=$(realpath "$1"); B=$(realpath "$2"); ROUNDS=${3:-3}
BASE=${DATA:-/var/tmp/uzfs-arcbench}; RUNTIME=${RUNTIME:-20}
ARC=$(numfmt --from=iec "${ARC:-512M}")
command -v fio >/dev/null || apt-get install -y -q fio >/dev/null
HZ=$(getconf CLK_TCK)
. "$(dirname "$0")/lib.sh"
cpu() { awk -v hz="$HZ" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }
misses() { # [FIELD] -> the daemon's cache misses (or FIELD) so far (pool arcb)
  python3 - "$UZFS_RUNDIR/uzfsd.sock" "${1:-misses}" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(json.dumps({"argv": ["arcstat", "--snapshot", "arcb"], "cwd": "/"}).encode() + b"\n")
s.shutdown(socket.SHUT_WR)
buf = b""
while not buf.endswith(b"\n"):
    c = s.recv(65536)
    if not c:
        break
    buf += c
r = json.loads(json.loads(buf)["stdout"])[0]
f = sys.argv[2]
print((r["stats"] if "stats" in r else r).get(f, 0))
PY
}
peak() { awk '/^VmHWM/ {print $2 / 1024}' "/proc/$1/status"; }
mkdir -p "$BASE"
written_files 10G "$BASE/d0"
OUT="$BASE/results.tsv"; : > "$OUT"

hot_pass() { # mount -> hit ratio of one O_DIRECT pass over hot (2,048 records)
  local m0 m1
  m0=$(misses)
  fio --name=h --ioengine=psync --direct=1 --filename="$1/hot" --size=256M --rw=randread \
      --bs=128k --randrepeat=0 --output=/dev/null
  m1=$(misses)
  python3 -c "print(round(1 - ($m1 - $m0) / 2048, 3))"
}

one() { # binary label round
  local U=$1 L=$2 R=$3 D="$BASE/$2"
  export UZFS_RUNDIR="$D/run"
  "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"; mkdir -p "$D"
  local M="$D/mnt"
  local cache=()
  if [[ "${L2:-}" == *"$L"* ]]; then
    truncate -s "$(numfmt --from=iec "${L2_SIZE:-$((2 * ARC))}")" "$D/l2.img"
    cache=(cache "$D/l2.img")
  fi
  UZFS_ARC_MAX=$ARC UZFS_ARC_MIN=$ARC "$U" zpool create -f -m "$M" arcb "$BASE/d0" "${cache[@]}" >/dev/null
  "$U" zfs set compression=off arcb
  local P; P=$(cat "$UZFS_RUNDIR/uzfsd.pid")
  fio --name=w --ioengine=psync --filename="$M/hot" --size=256M --rw=write --bs=1M \
      --end_fsync=1 --output=/dev/null
  fio --name=w --ioengine=psync --filename="$M/cold" --size=4G --rw=write --bs=1M \
      --end_fsync=1 --output=/dev/null
  fio --name=w --ioengine=psync --filename="$M/zipf" --size=$((2 * ARC)) --rw=write --bs=1M \
      --end_fsync=1 --output=/dev/null
  "$U" zinject -a arcb >/dev/null; sync; echo 3 > /proc/sys/vm/drop_caches
  local c0; c0=$(cpu "$P")
  for _ in 1 2 3; do hot_pass "$M" >/dev/null; done
  local before after zi zh
  before=$(hot_pass "$M")
  dd if="$M/cold" of=/dev/null bs=1M status=none
  after=$(hot_pass "$M")
  # Zipf: fresh cache, then RUNTIME s of skewed random reads.
  "$U" zinject -a arcb >/dev/null
  local r0; r0=$(misses)
  local h0 m0; h0=$(misses l2_hits); m0=$(misses l2_misses)
  fio --name=z --ioengine=psync --direct=1 --filename="$M/zipf" --size=$((2 * ARC)) \
      --rw=randread --bs=4k --random_distribution=zipf:1.2 --time_based=1 \
      --runtime="$RUNTIME" --output-format=json --output="$D/z.json"
  local r1; r1=$(misses)
  local h1 m1 l2held; h1=$(misses l2_hits); m1=$(misses l2_misses); l2held=$(misses l2_size)
  local l2hit=-
  [ ${#cache[@]} -gt 0 ] && l2hit=$(python3 -c "print(round(($h1 - $h0) / max($h1 - $h0 + $m1 - $m0, 1), 3))")
  local c1; c1=$(cpu "$P")
  python3 - "$D/z.json" "$r0" "$r1" "$L" "$R" "$before" "$after" "$c0" "$c1" "$(peak "$P")" \
      "$l2hit" "$((l2held >> 20))" >> "$OUT" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]["read"]
r0, r1 = int(sys.argv[2]), int(sys.argv[3])
l, r, before, after, c0, c1, peak, l2hit, l2mib = sys.argv[4:13]
hit = 1 - (r1 - r0) / max(j["total_ios"], 1)
l2mib = l2mib if l2hit != "-" else "-"
print(f"{l}\t{r}\t{before}\t{after}\t{j['iops']:.0f}\t{hit:.3f}\t{float(c1) - float(c0):.1f}\t{float(peak):.0f}\t{l2hit}\t{l2mib}")
PY
  tail -1 "$OUT"
  "$U" zpool export arcb >/dev/null 2>&1 || true
  "$U" daemon --stop >/dev/null 2>&1 || true
}

one_ext4() { # round
  local D="$BASE/ext4" R=$1 CG=/sys/fs/cgroup/memory/uzfs-arcbench
  [ -d /sys/fs/cgroup/memory ] || CG=/sys/fs/cgroup/uzfs-arcbench
  rm -rf "$D"; mkdir -p "$D/mnt"
  truncate -s 4G "$D/img"; mkfs.ext4 -q -F "$D/img"
  local L; L=$(losetup --direct-io=on -f --show "$D/img")
  mount "$L" "$D/mnt"
  fio --name=w --ioengine=psync --filename="$D/mnt/zipf" --size=$((2 * ARC)) --rw=write \
      --bs=1M --end_fsync=1 --output=/dev/null
  sync; echo 3 > /proc/sys/vm/drop_caches
  mkdir -p "$CG"
  if [ -f "$CG/memory.limit_in_bytes" ]; then
    echo $((ARC + (64 << 20))) > "$CG/memory.limit_in_bytes"
  else
    echo $((ARC + (64 << 20))) > "$CG/memory.max"
  fi
  local dev; dev=$(basename "$L")
  local s0; s0=$(awk '{print $3}' "/sys/block/$dev/stat")
  sh -c "echo \$\$ > $CG/cgroup.procs; exec fio --name=z --ioengine=psync --direct=0 \
      --filename=$D/mnt/zipf --size=$((2 * ARC)) --rw=randread --bs=4k \
      --random_distribution=zipf:1.2 --time_based=1 --runtime=$RUNTIME \
      --output-format=json --output=$D/z.json"
  local s1; s1=$(awk '{print $3}' "/sys/block/$dev/stat")
  umount "$D/mnt"; losetup -d "$L"; rmdir "$CG" 2>/dev/null || true
  python3 - "$D/z.json" "$s0" "$s1" "$R" >> "$OUT" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]["read"]
s0, s1, r = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
hit = 1 - (s1 - s0) * 512 / max(j["io_bytes"], 1)
print(f"E\t{r}\t-\t-\t{j['iops']:.0f}\t{hit:.3f}\t-\t-\t-\t-")
PY
  tail -1 "$OUT"
  rm -rf "$D"
}

for r in $(seq 1 "$ROUNDS"); do
  one "$A" A "$r"
  one "$B" B "$r"
  [ "${EXT4:-0}" = 1 ] && one_ext4 "$r"
done
echo "A=$A B=$B ARC=$ARC RUNTIME=$RUNTIME L2=${L2:-none}"
python3 - "$OUT" <<'PY'
import sys, statistics as st
rows = [l.split("\t") for l in open(sys.argv[1]).read().split("\n") if l]
cols = ["hot_hit_before_scan", "hot_hit_after_scan", "zipf_iops", "zipf_hit", "daemon_cpu_s", "peak_rss_mib",
        "zipf_l2_hit", "l2_held_mib"]
labs = [l for l in "ABE" if any(x[0] == l for x in rows)]
print("| metric | " + " | ".join(f"{l} median (min-max)" for l in labs) + " |")
print("|---" * (len(labs) + 1) + "|")
for i, c in enumerate(cols):
    cell = []
    for lab in labs:
        v = [float(x[2 + i]) for x in rows if x[0] == lab and x[2 + i] != "-"]
        cell.append(f"{st.median(v):g} ({min(v):g}-{max(v):g})" if v else "-")
    print(f"| {c} | " + " | ".join(cell) + " |")
PY
# The 10 GiB device file is not kept: benchmark images filled this VM's
# disk once.
rm -rf "$BASE/A" "$BASE/B" "$BASE/d0"
