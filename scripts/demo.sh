#!/usr/bin/env bash
# The uzfs demo: a mirrored pool on two file-backed disks, mounted through
# FUSE; a source tree unpacked and a program built in a zstd-compressed
# dataset, zfs list, df, zpool status, zdb's full verification, an export and
# an import with every file's sha256 checked; then a raidz2 pool with a hot
# spare: silent corruption found and repaired by a scrub, a disk that
# vanishes replaced by the spare on its own, and a `zpool replace`.
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

MNT="$DEMO_DIR/mnt"
run "$UZFS" zpool create -m "$MNT" demo mirror "$DEMO_DIR/disks/disk0" "$DEMO_DIR/disks/disk1"
{ grep -o 'mounted demo at .*' "$UZFS_RUNDIR/uzfsd.log" || true; } | tail -1   # the FUSE transport in use
run "$UZFS" zfs create -o compression=zstd demo/src
# Real programs on the mount: unpack a source tree, build a program, write a
# database; remember every file's hash.
tar -C "$(pwd)" --exclude=target --exclude=.git -cf - crates docs scripts | tar -C "$MNT/src" -xf -
mkdir -p "$MNT/src/hello"
cat > "$MNT/src/hello/hello.c" <<'EOC'
#include <stdio.h>
int main(void) { puts("hello from a program built on uzfs"); return 0; }
EOC
( cd "$MNT/src/hello" && cc -O2 -o hello hello.c && ./hello )
head -c 64M /dev/urandom > "$MNT/payload"
( cd "$MNT" && find . -type f -print0 | sort -z | xargs -0 sha256sum ) > "$DEMO_DIR/hashes"
run "$UZFS" zpool sync demo      # space figures are charged at txg commit
run "$UZFS" zfs list -o name,used,avail,refer,compressratio,mountpoint
run df -h "$MNT" "$MNT/src"
run "$UZFS" zpool status demo
run "$UZFS" zpool list
run "$UZFS" zpool get size,allocated,free,capacity,health,guid,feature@lz4_compress demo
run "$UZFS" zdb -b demo
run "$UZFS" zpool export demo
run "$UZFS" zpool import -d "$DEMO_DIR/disks"
run "$UZFS" zpool import -d "$DEMO_DIR/disks" demo
echo
if ( cd "$MNT" && sha256sum --quiet -c "$DEMO_DIR/hashes" ); then
  echo "after export/import: all $(wc -l < "$DEMO_DIR/hashes") files identical (sha256)"
else
  echo "after export/import: files DIFFER" >&2
  exit 1
fi
cp "$MNT/payload" "$DEMO_DIR/payload"
run "$UZFS" zpool history demo

echo; echo "=== RAID-Z2 with a hot spare ==="
R="$DEMO_DIR/disks"
truncate -s "$DISK_SIZE" "$R"/rz{0..5} "$R"/spare "$R"/new
run "$UZFS" zpool create -m "$DEMO_DIR/rzmnt" rz raidz2 "$R"/rz0 "$R"/rz1 "$R"/rz2 "$R"/rz3 "$R"/rz4 "$R"/rz5 spare "$R"/spare
obj=$("$UZFS" object put rz "$DEMO_DIR/payload")
run "$UZFS" zpool sync rz
run "$UZFS" zinject -d "$R"/rz1 -C 40 rz
run "$UZFS" zpool scrub -w rz
run "$UZFS" zpool status rz
run "$UZFS" zpool clear rz
run "$UZFS" zinject -d "$R"/rz3 -e nxio rz
"$UZFS" object put rz "$DEMO_DIR/payload" >/dev/null   # writes find rz3 gone
for _ in $(seq 50); do
  "$UZFS" zpool status rz | grep -q INUSE && "$UZFS" zpool status rz | grep -q resilvered && break
  sleep 0.2
done
run "$UZFS" zpool status rz
run "$UZFS" zpool replace -w rz "$R"/rz3 "$R"/new
run "$UZFS" zpool status rz
run "$UZFS" zpool iostat -v rz
"$UZFS" object get rz "$obj" "$DEMO_DIR/readback2"
if cmp -s "$DEMO_DIR/payload" "$DEMO_DIR/readback2"; then
  echo; echo "raidz2 data after corruption, a lost disk and a replacement: identical"
else
  echo "raidz2 data: DIFFERENT" >&2
  exit 1
fi
cat <<EOT

The pools stay imported. Try, with UZFS_RUNDIR=$UZFS_RUNDIR:
  $UZFS zpool status
  ls $MNT; $UZFS zfs list
  $UZFS zpool destroy demo && $UZFS zpool destroy rz && $UZFS daemon --stop
EOT
