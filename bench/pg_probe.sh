#!/usr/bin/env bash
# pgbench (scale 10, 1 and 8 clients, 10 s, 2 interleaved rounds) on two
# datasets of one uzfs mirror: one with the defaults, one created with the
# given `zfs create` options, to see what a property is worth to
# PostgreSQL (e.g. `-o recordsize=8K`, `-o sync=disabled`, `-o
# logbias=throughput`). PostgreSQL's own durable defaults.
#
# usage: bench/pg_probe.sh BIN ZFS-CREATE-OPTION...
# env: DATA [/var/tmp/uzfs-pgprobe]
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: bench/pg_probe.sh BIN ZFS-CREATE-OPTION..." >&2; exit 2; }
U=$(realpath "$1"); shift
D=${DATA:-/var/tmp/uzfs-pgprobe}
export UZFS_RUNDIR=$D/run UZFS_LOG=${UZFS_LOG:-info}
. "$(dirname "$0")/lib.sh"
PGB=$(pg_bin)
if [ -z "$PGB" ]; then
  apt-get install -y -q postgresql >/dev/null
  PGB=$(pg_bin)
fi
mkdir -p "$D"
written_files 3G "$D/d0" "$D/d1"
pg() { runuser -u postgres -- "$PGB/$1" "${@:2}"; }
cleanup() {
  for s in base other; do
    [ -f "$D/mnt/$s/pg/data/postmaster.pid" ] && pg pg_ctl -D "$D/mnt/$s/pg/data" -m immediate stop >/dev/null 2>&1
  done
  "$U" zpool destroy pp >/dev/null 2>&1 || true
  "$U" daemon --stop >/dev/null 2>&1 || true
}
trap cleanup EXIT
cleanup
"$U" zpool create -f -m "$D/mnt" pp mirror "$D/d0" "$D/d1" >/dev/null
"$U" zfs create pp/base >/dev/null
"$U" zfs create "$@" pp/other >/dev/null
port=5700
for s in base other; do
  port=$((port + 1))
  mkdir -p "$D/mnt/$s/pg" "$D/sock-$s"; chown postgres "$D/mnt/$s/pg" "$D/sock-$s"
  pg initdb -A trust -D "$D/mnt/$s/pg/data" >/dev/null
  pg pg_ctl -D "$D/mnt/$s/pg/data" -l "$D/sock-$s/log" -w \
    -o "-k $D/sock-$s -c listen_addresses='' -p $port" start >/dev/null
  pg createdb -h "$D/sock-$s" -p $port bench
  pg pgbench -h "$D/sock-$s" -p $port -i -s 10 -q bench >/dev/null 2>&1
done
for r in 1 2; do
  port=5700
  for s in base other; do
    port=$((port + 1))
    for c in 1 8; do
      t=$(pg pgbench -h "$D/sock-$s" -p $port -c $c -j $(( c < 2 ? c : 2 )) -T 10 bench 2>/dev/null |
          awk '/^tps/ {print $3}')
      echo "round $r $s ($([ $s = base ] && echo defaults || echo "$*")) clients $c: $t TPS"
    done
  done
done
