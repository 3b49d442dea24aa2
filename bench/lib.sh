# Shell helpers the bench scripts source (`. "$(dirname "$0")/lib.sh"`).

# written_files SIZE FILE...: device files of SIZE (truncate's syntax) with
# every block written (zeros), as a disk's blocks all exist: on a sparse
# file each copy-on-write block lands in a hole the host filesystem must
# allocate, a journal commit on every log flush that no disk pays. A file
# already of that size is kept as it is.
written_files() {
  local size=$1 f
  shift
  for f in "$@"; do
    [ -f "$f" ] && [ "$(stat -c %s "$f")" = "$(numfmt --from=iec "$size")" ] && continue
    truncate -s "$size" "$f"
    dd if=/dev/zero of="$f" bs=4M count=$(( $(stat -c %s "$f") / (4 << 20) )) \
       oflag=direct conv=notrunc status=none
  done
}

# pg_bin: the newest installed PostgreSQL's bin directory, or nothing.
pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
