#!/usr/bin/env bash
# The read path beside the peers (issue #16, point 6): a cold sequential
# read and metadata walks on uzfs (a mirror of two 8 GiB file disks,
# mounted through FUSE), zfs-fuse's mirror and ext4 on a loop device, on
# the same disk, interleaved. Each stack is set up once with a SEQ_SIZE
# file and a tree of NFILES small files, then ROUNDS rounds of (uzfs,
# zfs-fuse, ext4), each round measuring
#
#   cold read         fio, 1 MiB sequential reads of the file after
#                     drop_caches (and `zinject -a`: uzfs's own cache)
#   ls -lR, cold      right after the read (every cache dropped), then
#   ls -lR, warm      at once again, as ../shared/peers/peers.sh does
#   lstat walk        os.walk + lstat of every entry (bench/fslib.py)
#
# with the daemon's CPU seconds for each (user + system; ext4 has no
# daemon), per GiB for the read; at the end uzfs's peak RSS and the FUSE
# requests it served (UZFS_FUSE_STATS).
#
# usage: bench/read.sh   env: ROUNDS [5]  NFILES [20000]  SEQ_SIZE [2G]
#        PEERS ["zmirror ext4"]   DATA [/var/tmp/uzfs-readbench]
#        UZFS_BIN [target/release/uzfs, built first]  PEERS_SH [../shared/peers/peers.sh]
# Output: medians and ranges as a markdown table on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench/read.sh: must run as root" >&2; exit 1; }
ROUNDS=${ROUNDS:-5}
NFILES=${NFILES:-20000}
SEQ_SIZE=${SEQ_SIZE:-2G}
PEERS=${PEERS:-zmirror ext4}
DATA=${DATA:-/var/tmp/uzfs-readbench}
LIB=$(pwd)/bench/fslib.py
PEERS_SH=${PEERS_SH:-$(pwd)/../shared/peers/peers.sh}
[ -x "$PEERS_SH" ] || { echo "bench/read.sh: $PEERS_SH not found (set PEERS_SH, or PEERS=\"\")" >&2; exit 1; }
if [ -n "${UZFS_BIN:-}" ]; then
  U=$(realpath "$UZFS_BIN")
else
  cargo build --release --bins -q
  U=$(pwd)/target/release/uzfs
fi
export DATA
OUT="$DATA/read.tsv"
mkdir -p "$DATA"
: > "$OUT"
now() { echo "$EPOCHREALTIME"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", b-a}'; }
cpu_of() { [ -n "$1" ] && awk -v hz="$(getconf CLK_TCK)" '{printf "%.3f", ($14+$15)/hz}' "/proc/$1/stat" || echo 0; }

# ---------------------------------------------------------------- set up
export UZFS_RUNDIR="$DATA/uzfs/run" UZFS_FUSE_STATS=1
cleanup() {
  "$U" daemon --stop >/dev/null 2>&1 || true
  for p in $PEERS; do "$PEERS_SH" teardown "$p" >/dev/null 2>&1 || true; done
  rm -rf "$DATA/uzfs"
}
trap cleanup EXIT
"$U" daemon --stop >/dev/null 2>&1 || true
rm -rf "$DATA/uzfs"; mkdir -p "$DATA/uzfs"
truncate -s 8G "$DATA/uzfs/disk0.img" "$DATA/uzfs/disk1.img"
UM="$DATA/mnt/uzfs"
"$U" zpool create -f -m "$UM" readbench mirror "$DATA/uzfs/disk0.img" "$DATA/uzfs/disk1.img" >/dev/null
"$U" zfs create readbench/meta
UPID=$(cat "$UZFS_RUNDIR/uzfsd.pid")
layout() { # run-prefix... file: write the file to read (not measured)
  "$@" --name=layout --ioengine=psync --rw=write --bs=1M --size="$SEQ_SIZE" \
    --refill_buffers=1 --end_fsync=1 --output=/dev/null
}
layout fio --filename="$UM/seq.dat"
python3 "$LIB" create "$UM/meta/tree" "$NFILES" >/dev/null
sync

# Each peer: set up by peers.sh, its tree made through its namespace.
declare -A ROOT PID NS
for p in $PEERS; do
  "$PEERS_SH" setup "$p" >/dev/null
  # shellcheck disable=SC1090
  ZPID=""; . "$DATA/state/$p.env"
  NS[$p]=$ZPID; PID[$p]=$ZPID
  ROOT[$p]="$DATA/mnt/$p/meta/tree"
  run() { if [ -n "${NS[$p]}" ]; then nsenter -t "${NS[$p]}" -m -- "$@"; else "$@"; fi; }
  run mkdir -p "$DATA/mnt/$p/meta"
  layout run fio --filename="$DATA/mnt/$p/seq.dat"
  run python3 "$LIB" create "${ROOT[$p]}" "$NFILES" >/dev/null
  run sync
done
ROOT[uzfs]="$UM/meta/tree"; PID[uzfs]=$UPID; NS[uzfs]=""
GIB=$(numfmt --from=iec "$SEQ_SIZE" | awk '{printf "%.4f", $1 / 1073741824}')

# ---------------------------------------------------------------- rounds
for r in $(seq "$ROUNDS"); do
  for s in uzfs $PEERS; do
    run() { if [ -n "${NS[$s]}" ]; then nsenter -t "${NS[$s]}" -m -- "$@"; else "$@"; fi; }
    sync; echo 3 > /proc/sys/vm/drop_caches
    [ "$s" = uzfs ] && "$U" zinject -a readbench >/dev/null
    c0=$(cpu_of "${PID[$s]}")
    bw=$(run fio --name=seqread --ioengine=psync --rw=read --bs=1M --size="$SEQ_SIZE" \
      --filename="${ROOT[$s]%/meta/tree}/seq.dat" --output-format=json \
      | python3 -c 'import json,sys; print("%.1f" % (json.load(sys.stdin)["jobs"][0]["read"]["bw"] / 1024))')
    c1=$(cpu_of "${PID[$s]}")
    rcpu=$(awk -v a="$c0" -v b="$c1" -v g="$GIB" 'BEGIN{printf "%.3f", (b-a)/g}')
    c0=$(cpu_of "${PID[$s]}")
    t0=$(now); run ls -lR "${ROOT[$s]}" > /dev/null; tc=$(now)
    run ls -lR "${ROOT[$s]}" > /dev/null; t1=$(now)
    walk=$(run python3 "$LIB" stat-walk "${ROOT[$s]}")
    c1=$(cpu_of "${PID[$s]}")
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$s" "$r" "$(elapsed "$tc" "$t1")" "${walk% *}" \
      "$(awk -v a="$c0" -v b="$c1" 'BEGIN{printf "%.3f", b-a}')" "$bw" "$rcpu" "$(elapsed "$t0" "$tc")" >> "$OUT"
  done
done
RSS=$(awk '/VmHWM/{printf "%.0f", $2/1024}' "/proc/$UPID/status")
"$U" daemon --stop >/dev/null 2>&1 || true
REQS=$(grep -o 'fuse requests over .*' "$UZFS_RUNDIR/uzfsd.log" | tail -1)

python3 - "$OUT" "$NFILES" "$ROUNDS" "$PEERS" <<'EOF'
import statistics, sys
path, n, rounds, peers = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()
rows = [l.split("\t") for l in open(path).read().splitlines()]
stacks = ["uzfs"] + peers
def col(s, i):
    return [float(r[i]) for r in rows if r[0] == s]
def cell(v):
    return f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"
print(f"{rounds} interleaved rounds; median (min-max)\n")
print("| measure | " + " | ".join(stacks) + " | " + " | ".join(f"uzfs/{p}" for p in peers) + " |")
print("|---" * (1 + len(stacks) + len(peers)) + "|")
for name, i in [("seq read 1 MiB, cold (MiB/s)", 5), ("cold read, daemon CPU s per GiB", 6),
                (f"ls -lR of {n} files, cold (s)", 7), ("ls -lR, warm (s)", 2), ("lstat walk (s)", 3),
                ("walks, daemon CPU s", 4)]:
    meds = {s: statistics.median(col(s, i)) for s in stacks}
    ratios = [f"{meds['uzfs'] / meds[p]:.2f}" if meds[p] > 0 else "n/a" for p in peers]
    print(f"| {name} | " + " | ".join(cell(col(s, i)) for s in stacks) + " | " + " | ".join(ratios) + " |")
EOF
echo
echo "uzfs: peak RSS $RSS MiB; $REQS"
