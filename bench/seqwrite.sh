#!/usr/bin/env bash
# Sequential 1 MiB writes with an end fsync (issue #17): uzfs on a single
# disk, a mirror and a raidz2, beside ext4 and xfs on loop devices and
# zfs-fuse's mirror, all on the same disk, interleaved round by round.
#
# Each round sets every stack up fresh, writes a 1 GiB file and then a
# 4 GiB file (fio, psync, 1 MiB blocks, --end_fsync=1, caches dropped
# before each), and tears it down. For the daemons (uzfs, zfs-fuse) it
# records CPU seconds per GiB written (utime + stime of the daemon over
# the job) and the daemon's peak RSS (VmHWM). Kernel filesystems' CPU is
# spent in kernel threads not attributable to the job: "n/a".
#
# usage: bench/seqwrite.sh [ROUNDS]   (default 3)
# env: DATA [/var/tmp/uzfs-seqwrite]  UZFS_BIN [target/release/uzfs]
#      STACKS ["udisk umirror uraidz2 ext4 xfs zmirror"]  SIZES ["1G 4G"]
#      DISK_SIZE [8G]
# Output: $DATA/seqwrite.tsv and a markdown table on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench/seqwrite.sh: must run as root" >&2; exit 1; }
ROUNDS=${1:-3}
DATA=${DATA:-/var/tmp/uzfs-seqwrite}
U=$(realpath "${UZFS_BIN:-target/release/uzfs}")
STACKS=${STACKS:-"udisk umirror uraidz2 ext4 xfs zmirror"}
SIZES=${SIZES:-"1G 4G"}
DISK_SIZE=${DISK_SIZE:-8G}
PEERS=$(realpath ../shared/peers/peers.sh)
HZ=$(getconf CLK_TCK)
OUT="$DATA/seqwrite.tsv"
case " $STACKS " in *" xfs "*) command -v mkfs.xfs >/dev/null || apt-get install -y xfsprogs >/dev/null ;; esac
case " $STACKS " in *" zmirror "*) command -v zfs-fuse >/dev/null || "$PEERS" install >/dev/null ;; esac
peers() { # ACTION CONFIG, its log shown if it fails
  DATA="$DATA/peers" "$PEERS" "$1" "$2" > "$DATA/peers.log" 2>&1 || {
    cat "$DATA/peers.log" >&2; echo "bench/seqwrite.sh: peers.sh $1 $2 failed" >&2; exit 1; }
}
mkdir -p "$DATA"; : > "$OUT"

cpu() { awk -v hz="$HZ" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }
gib() { local s=$1; case "$s" in *G) echo "${s%G}";; *M) echo "scale=4; ${s%M}/1024" | bc;; esac; }

# setup STACK -> sets M (mount), P (daemon pid or ""), RUN (command prefix)
setup() {
  local s=$1 n layout
  RUN=(); P=""
  case "$s" in
    udisk|umirror|uraidz2)
      case "$s" in udisk) n=1; layout=();; umirror) n=2; layout=(mirror);; uraidz2) n=6; layout=(raidz2);; esac
      export UZFS_RUNDIR="$DATA/$s/run"
      "$U" daemon --stop >/dev/null 2>&1 || true
      rm -rf "${DATA:?}/$s"; mkdir -p "$DATA/$s"
      local disks=() i
      for i in $(seq 0 $((n - 1))); do truncate -s "$DISK_SIZE" "$DATA/$s/d$i"; disks+=("$DATA/$s/d$i"); done
      M="$DATA/$s/mnt"
      "$U" zpool create -f -m "$M" "sw$s" "${layout[@]}" "${disks[@]}" >/dev/null
      P=$(cat "$UZFS_RUNDIR/uzfsd.pid")
      ;;
    ext4|xfs)
      peers setup "$s"
      M="$DATA/peers/mnt/$s"
      ;;
    zmirror)
      peers setup "$s"
      M="$DATA/peers/mnt/$s"
      P=$(. "$DATA/peers/state/$s.env"; echo "$ZPID")
      RUN=(nsenter -t "$P" -m --)
      ;;
  esac
}

teardown() {
  local s=$1
  case "$s" in
    u*)
      export UZFS_RUNDIR="$DATA/$s/run"
      "$U" zpool destroy "sw$s" >/dev/null 2>&1 || true
      "$U" daemon --stop >/dev/null 2>&1 || true
      rm -rf "${DATA:?}/$s"
      ;;
    *) peers teardown "$s" ;;
  esac
}

for r in $(seq 1 "$ROUNDS"); do
  for s in $STACKS; do
    setup "$s"
    for size in $SIZES; do
      sync; echo 3 > /proc/sys/vm/drop_caches
      c0=""; [ -n "$P" ] && c0=$(cpu "$P")
      "${RUN[@]}" fio --name=w --ioengine=psync --direct=0 --filename="$M/f$size" --size="$size" \
        --rw=write --bs=1M --end_fsync=1 --output-format=json > "$DATA/fio.json"
      c1=""; [ -n "$P" ] && c1=$(cpu "$P")
      "${RUN[@]}" rm -f "$M/f$size"
      rss=""; [ -n "$P" ] && rss=$(awk '/VmHWM/{print $2/1024}' "/proc/$P/status")
      python3 - "$DATA/fio.json" "$r" "$s" "$size" "$(gib "$size")" "$c0" "$c1" "$rss" >> "$OUT" <<'PY'
import json, sys
f, r, s, size, g, c0, c1, rss = sys.argv[1:9]
w = json.load(open(f))["jobs"][0]["write"]
cpu = f"{(float(c1) - float(c0)) / float(g):.3f}" if c0 else "n/a"
print(f"{r}\t{s}\t{size}\t{w['bw'] / 1024:.1f}\t{cpu}\t{rss or 'n/a'}")
PY
      tail -1 "$OUT" >&2
    done
    teardown "$s"
  done
done

python3 - "$OUT" "$STACKS" <<'PY'
import collections, statistics as st, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
stacks = sys.argv[2].split()
v = collections.defaultdict(dict)
for r, s, size, bw, cpu, rss in rows:
    v[(s, size)][int(r)] = (float(bw), cpu, rss)
def med(xs):
    return f"{st.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})"
print("| stack | size | MiB/s median (min-max) | / ext4, median of rounds | / xfs | daemon CPU s/GiB | peak RSS MiB |")
print("|---|---|---:|---:|---:|---:|---:|")
for (s, size) in sorted(v, key=lambda k: (k[1], stacks.index(k[0]))):
    d = v[(s, size)]
    bws = [x[0] for x in d.values()]
    ratio = {}
    for peer in ("ext4", "xfs"):
        p = v.get((peer, size), {})
        rs = [d[i][0] / p[i][0] for i in d if i in p and p[i][0]]
        ratio[peer] = f"{st.median(rs):.2f}" if rs else "-"
    cpus = [float(x[1]) for x in d.values() if x[1] != "n/a"]
    rsss = [float(x[2]) for x in d.values() if x[2] != "n/a"]
    cpu = f"{st.median(cpus):.2f} ({min(cpus):.2f}-{max(cpus):.2f})" if cpus else "n/a"
    rss = f"{st.median(rsss):.0f}" if rsss else "n/a"
    print(f"| {s} | {size} | {med(bws)} | {ratio['ext4']} | {ratio['xfs']} | {cpu} | {rss} |")
PY
