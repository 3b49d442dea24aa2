#!/usr/bin/env bash
# uzfs benchmarks for the foundation (issue #2), reported beside peers on the
# same disk in one run:
#
#   seq write     SEQ_SIZE of incompressible data through the object layer to
#                 one file vdev (fletcher4, compression off), durable at the
#                 end; vs fio writing the same to a plain file on the same
#                 filesystem (bs=1M, end_fsync=1), vs fio on ext4 on a loop
#                 device backed by a file on the same filesystem, and (with
#                 --peers) vs zfs-fuse from ../shared/peers/peers.sh.
#   memory        peak RSS and peak dirty data during the seq write.
#   checksum      GB/s per core for fletcher4, sha256, blake3.
#   compression   lz4 and zstd on a mixed corpus.
#   txg commit    latency of a sync with 1, 64 and 1024 dirty 128K blocks.
#
# usage: bench/run.sh [--smoke] [--peers]
#   --smoke  small sizes, for CI (checks the harness, not the numbers)
#   --peers  also run peers.sh (zfs-fuse mirror) in the same run
# env: DATA [/var/tmp/uzfs-bench]  SEQ_SIZE [4G]
# Output: a markdown report on stdout and in $DATA/report.md.
set -euo pipefail
cd "$(dirname "$0")/.."
SMOKE=0; PEERS=0
for a in "$@"; do
  case "$a" in
    --smoke) SMOKE=1 ;;
    --peers) PEERS=1 ;;
    *) echo "usage: bench/run.sh [--smoke] [--peers]" >&2; exit 2 ;;
  esac
done
DATA=${DATA:-/var/tmp/uzfs-bench}
if [ $SMOKE = 1 ]; then
  SEQ_SIZE=${SEQ_SIZE:-256M}; CK=64M; CORPUS=16M; ROUNDS=3
else
  SEQ_SIZE=${SEQ_SIZE:-4G}; CK=2G; CORPUS=256M; ROUNDS=20
fi
mkdir -p "$DATA"
cargo build --release --bins -q
B=target/release/uzfs-bench
REPORT="$DATA/report.md"
: > "$REPORT"
out() { echo "$*" | tee -a "$REPORT"; }
bytes() { numfmt --from=iec "$1"; }
jget() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
wall_mibs() {  # bytes seconds
  awk -v b="$1" -v s="$2" 'BEGIN{printf "%.0f", b/s/1048576}'
}
fio_wall() {  # file -> seconds for SEQ_SIZE with an fsync at the end
  local t0 t1
  t0=$(date +%s.%N)
  # fio's default buffer is random (incompressible) and generated once, as
  # uzfs-bench's is; --refill_buffers would charge fio for generating data.
  fio --name=seq --ioengine=psync --rw=write --bs=1M --size="$SEQ_SIZE" --end_fsync=1 \
      --filename="$1" --output=/dev/null
  t1=$(date +%s.%N)
  rm -f "$1"
  awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b-a}'
}

out "# uzfs foundation benchmarks"
out ""
out "$(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, DATA on $(df --output=fstype "$DATA" | tail -1) ($(df --output=source "$DATA" | tail -1)); command: bench/run.sh $*"
out ""

SB=$(bytes "$SEQ_SIZE")
U=$($B seqwrite "$DATA" "$SEQ_SIZE")
U_MIBS=$(jget "$U" mib_s)
F_S=$(fio_wall "$DATA/fio-plain.dat")
F_MIBS=$(wall_mibs "$SB" "$F_S")
E_MIBS="n/a"
if [ "$(id -u)" = 0 ] && command -v mkfs.ext4 >/dev/null; then
  img="$DATA/ext4.img"; mnt="$DATA/ext4mnt"
  rm -f "$img"; truncate -s $((SB * 2 + (512 << 20))) "$img"
  if loop=$(losetup -f --show "$img" 2>/dev/null); then
    mkfs.ext4 -q -F "$loop" && mkdir -p "$mnt" && mount "$loop" "$mnt" && {
      E_S=$(fio_wall "$mnt/seq.dat"); E_MIBS=$(wall_mibs "$SB" "$E_S")
      umount "$mnt"
    }
    losetup -d "$loop"
  fi
  rm -f "$img"
fi
Z_MIBS="not run (use --peers)"
if [ $PEERS = 1 ]; then
  PEERS_SH=../shared/peers/peers.sh
  if [ -x "$PEERS_SH" ] || [ -f "$PEERS_SH" ]; then
    PR="$DATA/peers"
    RESULTS="$PR" SEQ_SIZE="$SEQ_SIZE" bash "$PEERS_SH" all zmirror >"$DATA/peers.log" 2>&1 || true
    zw=$(awk -F'\t' '$1=="seqwrite_wall_s"{print $2}' "$PR/zmirror/metrics.tsv" 2>/dev/null | tail -1)
    if [ -n "$zw" ]; then Z_MIBS=$(wall_mibs "$SB" "$zw"); else Z_MIBS="failed (see $DATA/peers.log)"; fi
  else
    Z_MIBS="peers.sh not found"
  fi
fi
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b+0>0) printf "%.2f", a/b; else print "n/a"}'; }
out "## Sequential write, $SEQ_SIZE, durable at the end (MiB/s, wall clock)"
out ""
out "| stack | MiB/s | uzfs ÷ stack |"
out "|---|---|---|"
out "| uzfs object layer, 1 file vdev, fletcher4, no compression | $U_MIBS | 1.00 |"
out "| fio, plain file on the same filesystem | $F_MIBS | $(ratio "$U_MIBS" "$F_MIBS") |"
out "| fio, ext4 on a loop device on the same filesystem | $E_MIBS | $(ratio "$U_MIBS" "$E_MIBS") |"
out "| fio, zfs-fuse mirror (peers.sh zmirror) | $Z_MIBS | $(ratio "$U_MIBS" "$Z_MIBS") |"
out ""
out "uzfs memory during that write: peak RSS $(jget "$U" peak_rss_mib) MiB, peak dirty data $(jget "$U" peak_dirty_mib) MiB (dirty_max $(jget "$U" dirty_max_mib) MiB)."
out ""
# The daemon's own memory under a sustained write load: SEQ_SIZE written as
# four objects through `uzfs object put`, with the default dirty limit and
# with UZFS_DIRTY_MAX=256 MiB.
UZ=target/release/uzfs
daemon_peak() {  # dirty_max_env -> "peak_rss_mib"
  local rd="$DATA/daemon-run" dd="$DATA/ddisk"
  UZFS_RUNDIR="$rd" $UZ daemon --stop >/dev/null 2>&1 || true
  rm -rf "$rd" "$dd"; truncate -s $((SB + SB / 2 + (512 << 20))) "$dd"
  UZFS_DIRTY_MAX="$1" UZFS_RUNDIR="$rd" $UZ zpool create -f benchmem "$dd" >&2
  for _ in 1 2 3 4; do UZFS_RUNDIR="$rd" $UZ object put benchmem "$DATA/payload" >/dev/null; done
  local pid; pid=$(cat "$rd/uzfsd.pid")
  awk '/VmHWM/{printf "%.0f", $2/1024}' "/proc/$pid/status"
  UZFS_RUNDIR="$rd" $UZ zpool destroy benchmem >&2
  UZFS_RUNDIR="$rd" $UZ daemon --stop >/dev/null
  rm -f "$dd"
}
head -c $((SB / 4)) /dev/urandom > "$DATA/payload"
M_DEF=$(daemon_peak "")
M_256=$(daemon_peak $((256 << 20)))
rm -f "$DATA/payload"
out "## Daemon memory under a sustained write load ($SEQ_SIZE via \`uzfs object put\`, 4 objects)"
out ""
out "| dirty_max | daemon peak RSS (VmHWM) |"
out "|---|---|"
out "| default (10% of RAM, max 4 GiB): $(jget "$U" dirty_max_mib) MiB | $M_DEF MiB |"
out "| UZFS_DIRTY_MAX=256 MiB | $M_256 MiB |"
out ""
out "## Checksums (one core)"
out ""
out "| algorithm | GB/s |"
out "|---|---|"
$B checksum "$CK" | while read -r l; do out "| $(jget "$l" alg) | $(jget "$l" gb_s) |"; done
out ""
out "## Compression, mixed corpus ($CORPUS: executable, text, integers, random), 128K blocks"
out ""
out "| algorithm | compress MB/s | decompress MB/s | ratio |"
out "|---|---|---|---|"
$B compress "$CORPUS" | while read -r l; do out "| $(jget "$l" alg) | $(jget "$l" compress_mb_s) | $(jget "$l" decompress_mb_s) | $(jget "$l" ratio) |"; done
out ""
out "## Txg commit latency ($ROUNDS rounds, 128K blocks, file vdev)"
out ""
out "| dirty blocks | p50 ms | p99 ms |"
out "|---|---|---|"
$B txg "$DATA" "$ROUNDS" | while read -r l; do out "| $(jget "$l" dirty_blocks) | $(jget "$l" p50_ms) | $(jget "$l" p99_ms) |"; done
