#!/usr/bin/env bash
# bench/fs.sh's uzfs workloads for two builds, interleaved on the same disk
# (before, after, after, before, ...): the disk's speed drifts by minutes,
# so only interleaved medians compare two builds. Prints, per workload, the
# median and range of each build and after/before (>1: after is better;
# times are inverted), plus daemon CPU seconds and peak RSS.
#
# usage: bench/before_after.sh BEFORE_BIN AFTER_BIN [ROUNDS]
#   e.g. git worktree add /var/tmp/before <commit>; (cd /var/tmp/before &&
#        cargo build --release --bins); bench/before_after.sh
#        /var/tmp/before/target/release/uzfs target/release/uzfs 3
#   or one build in two configurations, e.g. #16's 512 MiB point:
#        AFTER_ENV="UZFS_ARC_MAX=536870912" bench/before_after.sh
#        target/release/uzfs target/release/uzfs 6
# env: DATA [/var/tmp/uzfs-ba]  RUNTIME [10]  SEQ_SIZE [1G]  NFILES [20000]
#      BEFORE_ENV, AFTER_ENV: VAR=value words for that side's daemon
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: bench/before_after.sh BEFORE_BIN AFTER_BIN [ROUNDS]" >&2; exit 2; }
A=$(realpath "$1"); B=$(realpath "$2"); ROUNDS=${3:-3}
BASE=${DATA:-/var/tmp/uzfs-ba}
export RUNTIME=${RUNTIME:-10} SEQ_SIZE=${SEQ_SIZE:-1G} NFILES=${NFILES:-20000}
OUT="$BASE/all.tsv"
mkdir -p "$BASE"; : > "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  # ABBA: odd rounds run before first, even rounds after first, so a disk
  # that speeds up or slows down through the run favours neither build.
  order="before after"; [ $((r % 2)) = 0 ] && order="after before"
  for label in $order; do
    bin=$A; [ $label = after ] && bin=$B
    d="$BASE/$label-$r"; rm -rf "$d"
    echo "round $r: $label" >&2
    extra=${BEFORE_ENV:-}; [ $label = after ] && extra=${AFTER_ENV:-}
    # shellcheck disable=SC2086 # VAR=value words, split on purpose
    env $extra DATA="$d" UZFS_BIN="$bin" bench/fs.sh --uzfs-only > "$d.tsv" 2> "$d.err" \
      || { echo "fs.sh failed for $label round $r (see $d.err)" >&2; exit 1; }
    awk -v l=$label -v r=$r -F'\t' 'NF>=2{print l"\t"r"\t"$1"\t"$2}' "$d.tsv" >> "$OUT"
    for w in warm cold; do cp "$d/results/uzfs/walks-$w.txt" "$d.walks-$w.txt" 2>/dev/null || true; done
    rm -rf "$d"
  done
done
python3 - "$OUT" "$ROUNDS" <<'EOF'
import sys, statistics, collections
rows = collections.defaultdict(list)
fails = []
for line in open(sys.argv[1]):
    label, r, key, val = line.rstrip("\n").split("\t")[:4]
    if key.startswith("FAIL"):
        fails.append(f"{label} round {r}: {key} {val}")
        continue
    try:
        rows[(key, label)].append(float(val))
    except ValueError:
        pass
show = [
    ("seq write 1 MiB, end fsync (MiB/s)", "seqwrite_write_MiBps", True),
    ("seq read 1 MiB, cold (MiB/s)", "seqread_read_MiBps", True),
    ("4 KiB random read (IOPS)", "randread4k_read_iops", True),
    ("4 KiB write + fsync each (IOPS)", "syncwrite4k_write_iops", True),
    ("16 KiB buffered random write (MiB/s)", "randwrite16k_write_MiBps", True),
    ("create small files (s)", "meta_create_s", False),
    ("ls -lR, cold (s)", "meta_lsR_cold_s", False),
    ("stat walk (s)", "meta_stat_s", False),
    ("ls -lR, cold, median of 10 (s)", "meta_lsR_cold_med_s", False),
    ("stat walk, median of 10 (s)", "meta_stat_med_s", False),
    ("ls -lR, cold, mean of 10 (s)", "meta_lsR_cold_mean_s", False),
    ("stat walk, mean of 10 (s)", "meta_stat_mean_s", False),
    ("ls -lR, cold, fastest of 10 (s)", "meta_lsR_cold_min_s", False),
    ("stat walk, fastest of 10 (s)", "meta_stat_min_s", False),
    ("ARC metadata before the walks (MiB)", "arc_meta_before_walks_MiB", True),
    ("ARC metadata floor (MiB)", "arc_meta_floor_MiB", True),
    ("ARC metadata misses, 10 warm walks", "arc_meta_misses_warm_walks", False),
    ("ARC metadata misses, 10 cold ls", "arc_meta_misses_cold_ls", False),
    ("allocator trims, 10 warm walks", "trims_warm_walks", False),
    ("allocator trim time, 10 warm walks (ms)", "trim_ms_warm_walks", False),
    ("allocator trims, whole run", "trims_total", False),
    ("allocator trim time, whole run (ms)", "trim_ms_total", False),
    ("daemon CPU (s)", "daemon_cpu_s", False),
    ("daemon peak RSS (MiB)", "daemon_peak_rss_MiB", False),
]
def cell(v):
    if not v:
        return "n/a"
    return f"{statistics.median(v):g} ({min(v):g}-{max(v):g})"
print(f"| workload | before: median (range) | after: median (range) | after/before |")
print("|---|---:|---:|---:|")
for label, key, higher in show:
    a, b = rows.get((key, "before"), []), rows.get((key, "after"), [])
    ratio = "n/a"
    if a and b and statistics.median(a) > 0 and statistics.median(b) > 0:
        ma, mb = statistics.median(a), statistics.median(b)
        ratio = f"{(mb / ma) if higher else (ma / mb):.2f}"
    print(f"| {label} | {cell(a)} | {cell(b)} | {ratio} |")
print(f"\n{sys.argv[2]} rounds each, interleaved; ratios > 1 mean after is better (times inverted).")
for f in fails:
    print(f"- FAILED: {f}")
EOF
