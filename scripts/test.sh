#!/usr/bin/env bash
# Run every check CI runs: format, lints, all tests (unit, model/crash
# simulation, real-file and CLI integration), and the benchmarks in smoke mode.
#
#   UZFS_CRASH_SEEDS=N       crash-simulation seeds (default 300; try 5000 by hand)
#   UZFS_SCAN_CRASH_SEEDS=N  crash-during-scrub/resilver seeds (default 60)
#   UZFS_ZPL_CRASH_SEEDS=N   file-operation crash seeds (default 40)
#   UZFS_FS_SEEDS=N          mount exerciser seeds (default 4)
# The mount tests run twice: over FUSE over io_uring (where the kernel has
# it; scripts/setup.sh switches it on) and over /dev/fuse.
# The filesystem tests mount through FUSE: they need root and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"

cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
# The filesystem tests mount through FUSE; here they must run, not skip.
export UZFS_REQUIRE_FUSE=${UZFS_REQUIRE_FUSE:-1}
# Where the kernel has FUSE over io_uring (setup.sh switched it on), the
# mounts must really use it.
if [ "$(cat /sys/module/fuse/parameters/enable_uring 2>/dev/null)" = Y ] \
   && [ "$(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null || echo 0)" = 0 ]; then
  export UZFS_REQUIRE_URING=${UZFS_REQUIRE_URING:-1}
fi
cargo test --workspace
# The mount tests again over the other transport, /dev/fuse (and the
# page-cache stores, whose notifications share the request descriptors).
UZFS_FUSE_URING=0 UZFS_REQUIRE_URING=0 cargo test -p uzfs --test fs --test page_store
./bench/run.sh --smoke
./bench/redundancy.sh --smoke
./bench/fs.sh --smoke
./bench/grow.sh --smoke
./bench/sync.sh --smoke
echo "all checks passed"
