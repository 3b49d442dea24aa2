#!/usr/bin/env bash
# The uzfs demo: a mirrored pool on two file-backed disks, data written and
# read back through the object layer, zpool status, zdb's full verification,
# an export and an import from the scanned directory.
#
#   DEMO_DIR=/var/tmp/uzfs-demo  where the disk files and run directory go
#   DISK_SIZE=512M               size of each file disk
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh >/dev/null
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"

DEMO_DIR=${DEMO_DIR:-/var/tmp/uzfs-demo}
DISK_SIZE=${DISK_SIZE:-512M}
UZFS=$(pwd)/target/release/uzfs
export UZFS_RUNDIR="$DEMO_DIR/run"

run() { echo; echo "\$ $*"; "$@"; }

# Start clean: stop an earlier demo's daemon and remove its files.
"$UZFS" daemon --stop >/dev/null 2>&1 || true
rm -rf "$DEMO_DIR"
mkdir -p "$DEMO_DIR/disks"
truncate -s "$DISK_SIZE" "$DEMO_DIR/disks/disk0" "$DEMO_DIR/disks/disk1"

run "$UZFS" zpool create demo mirror "$DEMO_DIR/disks/disk0" "$DEMO_DIR/disks/disk1"
head -c 64M /dev/urandom > "$DEMO_DIR/payload"
obj=$("$UZFS" object put demo "$DEMO_DIR/payload")
echo; echo "wrote 64 MiB as object $obj of pool 'demo'"
run "$UZFS" zpool status demo
run "$UZFS" zpool list
run "$UZFS" zpool get size,allocated,free,capacity,health,guid,feature@lz4_compress demo
run "$UZFS" zdb -b demo
run "$UZFS" zpool export demo
run "$UZFS" zpool import -d "$DEMO_DIR/disks"
run "$UZFS" zpool import -d "$DEMO_DIR/disks" demo
"$UZFS" object get demo "$obj" "$DEMO_DIR/readback"
echo
if cmp -s "$DEMO_DIR/payload" "$DEMO_DIR/readback"; then
  echo "read back after export/import: identical ($(sha256sum < "$DEMO_DIR/readback" | cut -c1-16)...)"
else
  echo "read back after export/import: DIFFERENT" >&2
  exit 1
fi
run "$UZFS" zpool history demo
cat <<EOT

The pool stays imported. Try, with UZFS_RUNDIR=$UZFS_RUNDIR:
  $UZFS zpool status
  $UZFS zpool destroy demo && $UZFS daemon --stop
EOT
