#!/usr/bin/env bash
# Run every check CI runs: format, lints, all tests (unit, model/crash
# simulation, real-file and CLI integration), and the benchmarks in smoke mode.
#
#   UZFS_CRASH_SEEDS=N       crash-simulation seeds (default 300; try 5000 by hand)
#   UZFS_SCAN_CRASH_SEEDS=N  crash-during-scrub/resilver seeds (default 60)
#   UZFS_ZPL_CRASH_SEEDS=N   file-operation crash seeds (default 40)
#   UZFS_FS_SEEDS=N          mount exerciser seeds (default 4)
# The filesystem tests mount through FUSE: they need root and /dev/fuse.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
[ -d "$HOME/.cargo/bin" ] && export PATH="$HOME/.cargo/bin:$PATH"

cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
# The filesystem tests mount through FUSE; here they must run, not skip.
export UZFS_REQUIRE_FUSE=${UZFS_REQUIRE_FUSE:-1}
cargo test --workspace
./bench/run.sh --smoke
./bench/redundancy.sh --smoke
./bench/fs.sh --smoke
echo "all checks passed"
