#!/usr/bin/env bash
# uzfs benchmarks for RAID-Z, scrub and resilver (issue #3), reported beside
# peers from the same run:
#
#   parity     RAID-Z parity generation and reconstruction, GB/s per core
#   layouts    sequential write then cold read of LAYOUT_SIZE on a single
#              disk, a 2-way mirror, raidz1 over 4 and raidz2 over 6 file vdevs
#              (object layer, 1 MiB requests, 128K records, no compression)
#   resilver   a fragmented mirror (blocks written in random order, half
#              freed and rewritten) resilvered onto a replaced device, issued
#              sorted by address, in birth order and in logical (walk) order;
#              on the real files and on devices emulating a rotating disk
#   scrub      raidz1 x4 holding SCRUB_SIZE, cold, against the devices' read
#              bandwidth
#   scrubload  foreground read and write latency during a scrub: no
#              priorities, the old sleep throttle (scan_delay_us), and the
#              leaf queues' priority classes (vdev/queue.rs), SL_ROUNDS
#              rounds interleaved (uzfs-bench takes SL_LOAD=read|write and
#              SL_CASES=queues: idle and the default only; UZFS_LOG=debug)
#   --peers    zfs-fuse raidz1 x4 (scrub, replace, fio seq write/read) and
#              ext4-on-loop (fio seq write/read) via ../shared/peers/peers.sh
#
# usage: bench/redundancy.sh [--smoke] [--peers]
# env: DATA [/var/tmp/uzfs-bench]  LAYOUT_SIZE [4G]  RS_SIZE [2G]
#      HDD_SIZE [256M]  SCRUB_SIZE [4G]
# Output: markdown on stdout and in $DATA/redundancy.md.
set -euo pipefail
cd "$(dirname "$0")/.."
SMOKE=0; PEERS=0
for a in "$@"; do
  case "$a" in
    --smoke) SMOKE=1 ;;
    --peers) PEERS=1 ;;
    *) echo "usage: bench/redundancy.sh [--smoke] [--peers]" >&2; exit 2 ;;
  esac
done
DATA=${DATA:-/var/tmp/uzfs-bench}
if [ $SMOKE = 1 ]; then
  LAYOUT_SIZE=${LAYOUT_SIZE:-128M}; RS_SIZE=${RS_SIZE:-128M}; HDD_SIZE=${HDD_SIZE:-16M}
  SCRUB_SIZE=${SCRUB_SIZE:-128M}; PARITY=64M; SL_ROUNDS=${SL_ROUNDS:-1}
else
  LAYOUT_SIZE=${LAYOUT_SIZE:-4G}; RS_SIZE=${RS_SIZE:-2G}; HDD_SIZE=${HDD_SIZE:-256M}
  SCRUB_SIZE=${SCRUB_SIZE:-4G}; PARITY=1G; SL_ROUNDS=${SL_ROUNDS:-3}
fi
mkdir -p "$DATA"
cargo build --release --bins -q
B=target/release/uzfs-bench
REPORT="$DATA/redundancy.md"
: > "$REPORT"
out() { echo "$*" | tee -a "$REPORT"; }
jget() { python3 -c "import json,sys; v=json.loads(sys.argv[1]); [v:=v[k] if not k.isdigit() else v[int(k)] for k in sys.argv[2].split('.')]; print(v)" "$1" "$2"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b+0>0) printf "%.2f", a/b; else print "n/a"}'; }

out "# uzfs redundancy benchmarks (RAID-Z, scrub, resilver)"
out ""
out "$(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM, DATA on $(df --output=fstype "$DATA" | tail -1) ($(df --output=source "$DATA" | tail -1)); command: bench/redundancy.sh $*"
out ""
out "All file vdevs live on the same disk, so \"devices\" share its bandwidth."
out ""

out "## Parity, one core (128 KiB blocks, 4 data columns)"
out ""
out "| layout | generate GB/s | rebuild 1 col | rebuild 2 cols | rebuild 3 cols |"
out "|---|---|---|---|---|"
$B parity "$PARITY" | while read -r l; do
  r=$(jget "$l" rebuild_gb_s | tr -d '[] ' | tr ',' ' ')
  set -- $r
  out "| $(jget "$l" layout) | $(jget "$l" generate_gb_s) | ${1:--} | ${2:--} | ${3:--} |"
done
out ""

DEV=$($B devbw "$DATA" "$( [ $SMOKE = 1 ] && echo 128M || echo 2G )")
DEV_W=$(jget "$DEV" mib_s); DEV_C=$(jget "$DEV" copy_mib_s)

out "## Sequential write and cold read, $LAYOUT_SIZE (MiB/s)"
out ""
out "| pool | write | read | write ÷ single disk | read ÷ single disk |"
out "|---|---|---|---|---|"
LAY=$($B layouts "$DATA" "$LAYOUT_SIZE")
W1=$(echo "$LAY" | head -1 | python3 -c "import json,sys; print(json.loads(sys.stdin.read())['write_mib_s'])")
R1=$(echo "$LAY" | head -1 | python3 -c "import json,sys; print(json.loads(sys.stdin.read())['read_mib_s'])")
while read -r l; do
  w=$(jget "$l" write_mib_s); r=$(jget "$l" read_mib_s)
  out "| uzfs $(jget "$l" layout) | $w | $r | $(ratio "$w" "$W1") | $(ratio "$r" "$R1") |"
  case "$(jget "$l" layout)" in "raidz1 x4") RZ_W=$w; RZ_R=$r ;; esac
done <<< "$LAY"
out ""

out "## Resilver of a fragmented mirror onto a replaced device"
out ""
out "New device alone: sequential write $DEV_W MiB/s; a copy on this disk (cold read + write + fsync): $DEV_C MiB/s."
out ""
out "| media | data | issue order | seconds | MiB/s | ÷ device write | ÷ disk copy |"
out "|---|---|---|---|---|---|---|"
declare -A RS
for media in files hdd; do
  size=$RS_SIZE; flag=""
  if [ $media = hdd ]; then size=$HDD_SIZE; flag=hdd; fi
  for order in sorted birth logical; do
    l=$($B resilver "$DATA" "$size" "$order" $flag)
    m=$(jget "$l" mib_s); s=$(jget "$l" seconds)
    RS[$media-$order]=$s
    label=$([ $media = hdd ] && echo "emulated rotating disks (8 ms seek + 4 ms rotation)" || echo "file vdevs")
    out "| $label | $size | $order | $s | $m | $(ratio "$m" "$DEV_W") | $(ratio "$m" "$DEV_C") |"
  done
done
out ""
out "Sorted vs logical order: $(ratio "${RS[files-logical]}" "${RS[files-sorted]}")x faster on the file vdevs, $(ratio "${RS[hdd-logical]}" "${RS[hdd-sorted]}")x on emulated rotating disks; sorted vs birth order: $(ratio "${RS[files-birth]}" "${RS[files-sorted]}")x and $(ratio "${RS[hdd-birth]}" "${RS[hdd-sorted]}")x."
out ""

out "## Scrub, raidz1 x4 holding $SCRUB_SIZE, cold"
out ""
SC=$($B scrub "$DATA" "$SCRUB_SIZE")
SC_RAW=$(jget "$SC" raw_mib_s)
out "| measure | MiB/s |"
out "|---|---|"
out "| uzfs scrub, raw bytes read and verified per second | $SC_RAW |"
out "| the 4 devices read one at a time, summed | $(jget "$SC" dev_sum_mib_s) |"
out "| the 4 devices read at once (they share one disk) | $(jget "$SC" dev_together_mib_s) |"
out ""
out "Scrub ÷ devices read at once: $(ratio "$SC_RAW" "$(jget "$SC" dev_together_mib_s)"); ÷ sum of single-device reads: $(ratio "$SC_RAW" "$(jget "$SC" dev_sum_mib_s)") (seconds: $(jget "$SC" seconds))."
out ""

out "## Foreground I/O during a scrub (raidz1 x4, $SCRUB_SIZE, cold; random 128K reads back to back, or 128K writes each committed by a txg; $SL_ROUNDS rounds interleaved)"
out ""
out "| load | case | ops (median) | p50 ms (median) | p99 ms median (range) | scrub s median (range) |"
out "|---|---|---|---|---|---|"
$B scrubload "$DATA" "$SCRUB_SIZE" "$SL_ROUNDS" > "$DATA/scrubload.jsonl"
python3 - "$DATA/scrubload.jsonl" <<'PY' | while read -r l; do out "$l"; done
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
keys = []
for r in runs:
    k = (r["load"], r["case"])
    if k not in keys:
        keys.append(k)
for load, case in keys:
    rs = [r for r in runs if (r["load"], r["case"]) == (load, case)]
    med = lambda f: statistics.median(r[f] for r in rs)
    p99 = [r["p99_ms"] for r in rs]
    sc = [r["scrub_s"] for r in rs if r["scrub_s"] is not None]
    scs = f"{statistics.median(sc):.2f} ({min(sc):.2f}-{max(sc):.2f})" if sc else "-"
    print(f"| {load} | {case} | {med('ops'):.0f} | {med('p50_ms'):.2f} | {med('p99_ms'):.2f} ({min(p99):.2f}-{max(p99):.2f}) | {scs} |")
PY
out ""

if [ $PEERS = 1 ]; then
  PEERS_SH=../shared/peers/peers.sh
  PR="$DATA/peers"
  RESULTS="$PR" bash "$PEERS_SH" all zraidz ext4 >"$DATA/peers-redundancy.log" 2>&1 || true
  m() { awk -F'\t' -v k="$2" '$1==k{print $2}' "$PR/$1/metrics.tsv" 2>/dev/null | tail -1; }
  out "## Beside the peers (same run; peers.sh with its defaults, fio through a mounted filesystem)"
  out ""
  out "| measure | uzfs | zfs-fuse raidz1 x4 | ext4-on-loop | uzfs ÷ zfs-fuse | uzfs ÷ ext4 |"
  out "|---|---|---|---|---|---|"
  zw=$(m zraidz seqwrite_write_MiBps); zr=$(m zraidz seqread_read_MiBps)
  ew=$(m ext4 seqwrite_write_MiBps); er=$(m ext4 seqread_read_MiBps)
  out "| seq write MiB/s (uzfs raidz1 x4, object layer) | $RZ_W | ${zw:-n/a} | ${ew:-n/a} | $(ratio "$RZ_W" "${zw:-0}") | $(ratio "$RZ_W" "${ew:-0}") |"
  out "| cold seq read MiB/s (uzfs raidz1 x4, object layer) | $RZ_R | ${zr:-n/a} | ${er:-n/a} | $(ratio "$RZ_R" "${zr:-0}") | $(ratio "$RZ_R" "${er:-0}") |"
  zs=$(m zraidz scrub_raw_MiBps)
  out "| scrub, raw MiB/s | $SC_RAW | ${zs:-n/a} | n/a | $(ratio "$SC_RAW" "${zs:-0}") | |"
  zrs=$(m zraidz resilver_MiBps)
  RS_SORTED_MIBS=$(awk -v s="${RS[files-sorted]}" -v b="$(numfmt --from=iec "$RS_SIZE")" 'BEGIN{printf "%.0f", b/1048576/s}')
  out "| replace one disk, MiB/s resilvered | $RS_SORTED_MIBS (mirror, fragmented) | ${zrs:-n/a} | n/a | $(ratio "$RS_SORTED_MIBS" "${zrs:-0}") | |"
  out ""
  out "zfs-fuse log: $DATA/peers-redundancy.log; metrics: $PR/{zraidz,ext4}/metrics.tsv."
fi
echo "report: $REPORT" >&2
