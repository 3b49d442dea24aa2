#!/usr/bin/env bash
# Space kept by deleted files' dnodes, for one or two builds: a 2 GiB
# one-disk pool, NFILES empty files created in 100 directories through
# the FUSE mount, deleted again, synced, exported and imported; prints the
# dataset's USED at each step. Before issue #18, emptied dnode blocks
# stayed allocated (about 257 MB per million files deleted).
#
# usage: bench/dnode_space.sh UZFS_BIN [UZFS_BIN2]
# env: DATA [/var/tmp/uzfs-dnode]  NFILES [100000]
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bench/dnode_space.sh UZFS_BIN [UZFS_BIN2]" >&2; exit 2; }
BASE=${DATA:-/var/tmp/uzfs-dnode}; NFILES=${NFILES:-100000}
for U in "$@"; do
  U=$(realpath "$U"); D="$BASE/run-$$"; export UZFS_RUNDIR="$D/run"
  rm -rf "$D"; mkdir -p "$D"; truncate -s 2G "$D/d0"
  "$U" zpool create -f -m "$D/mnt" dn "$D/d0" >/dev/null
  "$U" zpool sync dn; empty=$("$U" zfs list -Hp -o used dn)
  python3 - "$D/mnt" "$NFILES" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
per = max(1, n // 100)
for d in range(100):
    os.mkdir(f"{root}/d{d}")
    for f in range(per):
        open(f"{root}/d{d}/f{f}", "w").close()
PY
  "$U" zpool sync dn; full=$("$U" zfs list -Hp -o used dn)
  rm -rf "$D"/mnt/d*; sleep 3; "$U" zpool sync dn; "$U" zpool sync dn
  after=$("$U" zfs list -Hp -o used dn)
  "$U" zpool export dn; "$U" zpool import -d "$D" dn >/dev/null
  again=$("$U" zfs list -Hp -o used dn)
  printf '%s\tempty %s\twith %s files %s\tdeleted %s\tafter import %s\n' \
    "$U" "$empty" "$NFILES" "$full" "$after" "$again"
  "$U" zpool destroy dn; "$U" daemon --stop >/dev/null; rm -rf "$D"
done
