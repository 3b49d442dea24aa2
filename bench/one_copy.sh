#!/usr/bin/env bash
# What a read through a mount leaves in the daemon's cache (issue #16,
# "one copy"): a SIZE file written and synced on a mirror of two files,
# the caches dropped (`zinject -a`, drop_caches), then read with `cat`
# (through the kernel's page cache), again (the kernel answers), and with
# `dd iflag=direct` (nothing for the kernel to keep). After each: the
# ARC's file data, records handed to the kernel, data misses and the
# `iohits` among them (misses that waited for a read in flight: device
# reads are the difference).
#
# usage: bench/one_copy.sh [BIN...]   (default target/release/uzfs)
# env: DATA [/var/tmp/uzfs-onecopy]  SIZE [512M]
set -euo pipefail
[ "$(id -u)" = 0 ] || { echo "bench/one_copy.sh: must run as root" >&2; exit 1; }
D=${DATA:-/var/tmp/uzfs-onecopy}; SIZE=${SIZE:-512M}
export UZFS_RUNDIR="$D/run"
[ $# -gt 0 ] || set -- target/release/uzfs
for b in "$@"; do
  U=$(realpath "$b")
  "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"; mkdir -p "$D"; truncate -s 4G "$D/d0" "$D/d1"
  "$U" zpool create -f -m "$D/mnt" oc mirror "$D/d0" "$D/d1" >/dev/null
  head -c "$SIZE" /dev/urandom > "$D/mnt/f"; sync; "$U" zpool sync oc
  st() { awk -v n="$1" '$1 == n {print $3}' "$UZFS_RUNDIR/arcstats"; }
  show() {
    sleep 3   # the arcstats file is rewritten every second
    echo "$(basename "$U") $1: data_size=$(st data_size) handed_off=$(st uzfs_handed_off)" \
      "data_misses=$(( $(st demand_data_misses) + $(st prefetch_data_misses) )) iohits=$(st iohits)"
  }
  sync; echo 3 > /proc/sys/vm/drop_caches; "$U" zinject -a oc
  cat "$D/mnt/f" > /dev/null; show "cold cat"
  cat "$D/mnt/f" > /dev/null; show "warm cat"
  dd if="$D/mnt/f" of=/dev/null bs=1M iflag=direct status=none; show "dd iflag=direct"
  "$U" zpool destroy oc; "$U" daemon --stop >/dev/null 2>&1 || true
  rm -rf "$D"
done
