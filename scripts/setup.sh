#!/usr/bin/env bash
# Install what uzfs needs on a fresh Debian (bookworm) machine, then build it.
# Idempotent: safe to run again. Needs root for apt (uses sudo if not root).
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# fuse3: fusermount3 and the kernel module helpers; git, sqlite3, make, gcc:
# the real-program tests on a mounted filesystem; acl: setfacl/getfacl for
# the POSIX ACL test; rsync: browsing `.zfs/snapshot` while writes go on;
# sanoid, faketime: sanoid's snapshot and prune cycle, hours compressed.
pkgs=(build-essential pkg-config curl ca-certificates fio e2fsprogs util-linux fuse3 procps python3 coreutils git sqlite3 make gcc tar acl rsync sanoid faketime)
missing=()
for p in "${pkgs[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "setup: installing the Rust toolchain with rustup"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c clippy,rustfmt
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi

# FUSE over io_uring (Linux 6.14+): per-CPU request queues, 2-3x faster
# small-file work than /dev/fuse. The kernel ships it switched off; uzfs
# uses it where it is on (UZFS_FUSE_URING=0 keeps /dev/fuse).
URING=/sys/module/fuse/parameters/enable_uring
if [ -e "$URING" ] && [ "$(cat "$URING")" = N ] && [ "${UZFS_SETUP_URING:-1}" = 1 ]; then
  echo "setup: enabling FUSE over io_uring ($URING = Y)"
  echo Y | $SUDO tee "$URING" >/dev/null || echo "setup: could not enable it; mounts will use /dev/fuse"
fi

cargo build --release --bins
echo "setup: built $(pwd)/target/release/uzfs"
