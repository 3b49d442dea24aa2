#!/usr/bin/env bash
# Sequential-write cost of uzfs builds or settings side by side (issue
# #17's CPU per GiB): each round runs every configuration once, in order,
# on a fresh pool of 8 GiB files on the disk, a fresh daemon and dropped
# caches; fio writes SIZE with 1 MiB psync writes and an end fsync.
# Reports, per configuration, medians (and ranges) of MiB/s, the daemon's
# CPU seconds per GiB (utime + stime over the job), its minor page faults
# per GiB (fresh memory the kernel faults in and clears) and its peak RSS.
#
# usage: bench/seqwrite_ab.sh ROUNDS SIZE LAYOUT CONFIG...
#   SIZE: 1G, 4G, ...   LAYOUT: disk | mirror | raidz2 (6 files)
#   CONFIG: "name|binary|ENV=VALUE ENV=VALUE" (the environment is the
#   daemon's: it is started by `zpool create`)
# env: DATA [/var/tmp/uzfs-seqwrite-ab]
# e.g. bench/seqwrite_ab.sh 3 1G disk "before|/tmp/uzfs-a|" "after|target/release/uzfs|"
set -euo pipefail
[ $# -ge 4 ] || { sed -n 2,16p "$0" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "bench/seqwrite_ab.sh: must run as root" >&2; exit 1; }
ROUNDS=$1; SIZE=$2; LAYOUT=$3; shift 3
D=${DATA:-/var/tmp/uzfs-seqwrite-ab}
export UZFS_RUNDIR=$D/run
HZ=$(getconf CLK_TCK)
case $LAYOUT in
  disk) N=1; L=() ;; mirror) N=2; L=(mirror) ;; raidz2) N=6; L=(raidz2) ;;
  *) echo "bench/seqwrite_ab.sh: unknown layout $LAYOUT" >&2; exit 2 ;;
esac
GIB=$(numfmt --from=iec "$SIZE" | awk '{print $1 / 2^30}')
OUT=$(mktemp)
for r in $(seq "$ROUNDS"); do
  for cfg in "$@"; do
    IFS='|' read -r name bin envs <<< "$cfg"
    bin=$(realpath "$bin")
    "$bin" daemon --stop >/dev/null 2>&1 || true
    rm -rf "${D:?}"; mkdir -p "$D"; disks=()
    for i in $(seq 0 $((N - 1))); do truncate -s 8G "$D/d$i"; disks+=("$D/d$i"); done
    # shellcheck disable=SC2086
    env $envs "$bin" zpool create -f -m "$D/mnt" swab "${L[@]}" "${disks[@]}" >/dev/null
    P=$(cat "$UZFS_RUNDIR/uzfsd.pid")
    sync; echo 3 > /proc/sys/vm/drop_caches
    read -r f0 c0 < <(awk '{print $10, $14 + $15}' "/proc/$P/stat")
    bw=$(fio --name=w --filename="$D/mnt/f" --rw=write --bs=1M --size="$SIZE" --ioengine=psync \
          --end_fsync=1 --output-format=json \
        | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["jobs"][0]["write"]["bw"]/1024,1))')
    read -r f1 c1 < <(awk '{print $10, $14 + $15}' "/proc/$P/stat")
    hwm=$(awk '/VmHWM/{print int($2/1024)}' "/proc/$P/status")
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$name" "$LAYOUT" "$SIZE" "$bw" \
      "$(awk -v c="$((c1 - c0))" -v hz="$HZ" -v g="$GIB" 'BEGIN{printf "%.3f", c / hz / g}')" \
      "$(awk -v f="$((f1 - f0))" -v g="$GIB" 'BEGIN{printf "%d", f / g}')" "$hwm" | tee -a "$OUT"
    "$bin" daemon --stop >/dev/null 2>&1 || true
  done
done
python3 - "$OUT" <<'PY'
import sys, statistics as st, collections
rows = collections.OrderedDict()
for l in open(sys.argv[1]):
    f = l.rstrip("\n").split("\t")
    rows.setdefault((f[1], f[2], f[3]), []).append([float(x) for x in f[4:8]])
print("| config | layout | size | MiB/s median (min-max) | daemon CPU s/GiB median (min-max) | minor faults/GiB median | peak RSS MiB median |")
print("|---|---|---|---:|---:|---:|---:|")
for k, v in rows.items():
    c = list(zip(*v))
    m = lambda i: f"{st.median(c[i]):g} ({min(c[i]):g}-{max(c[i]):g})"
    print(f"| {k[0]} | {k[1]} | {k[2]} | {m(0)} | {m(1)} | {int(st.median(c[2]))} | {int(st.median(c[3]))} |")
PY
rm -f "$OUT"
