#!/usr/bin/env python3
"""Helpers for bench/fs.sh, so the uzfs side needs nothing outside the repo.

  fslib.py fio-metrics JSON PREFIX   one "key<TAB>value<TAB>unit" line per figure
  fslib.py create ROOT N             make N files of 4 KiB in 20 x 10 directories;
                                     prints "seconds N"
  fslib.py stat-walk ROOT            lstat everything below ROOT; prints "seconds count"

The create and stat-walk workloads have the same shape as the peers
harness's metadata test (../shared/peers), so figures compare across them;
the metric names match what peers.sh records.
"""
import json
import os
import sys
import time


def fio_metrics(path, prefix):
    text = open(path).read()
    job = json.loads(text[text.index("{"):])["jobs"][0]
    rows = []
    for kind in ("read", "write"):
        d = job[kind]
        if not d.get("total_ios") and not d.get("io_bytes"):
            continue
        rows.append((f"{kind}_MiBps", f"{d['bw_bytes'] / 2**20:.1f}", "MiB/s"))
        rows.append((f"{kind}_iops", f"{d['iops']:.0f}", "IOPS"))
        pct = d.get("clat_ns", {}).get("percentile", {})
        if pct:
            rows.append((f"{kind}_p99_us", f"{pct['99.000000'] / 1000:.1f}", "us"))
    sync = job.get("sync", {})
    if sync.get("total_ios"):
        pct = sync.get("lat_ns", {}).get("percentile", {})
        if pct:
            rows.append(("fsync_p99_us", f"{pct['99.000000'] / 1000:.1f}", "us"))
    for key, value, unit in rows:
        print(f"{prefix}_{key}\t{value}\t{unit}")


def create(root, n):
    n = int(n)
    tops, subs = 20, 10
    per_dir = max(1, -(-n // (tops * subs)))
    payload = os.urandom(4096)
    made = 0
    start = time.perf_counter()
    for t in range(tops):
        for s in range(subs):
            d = os.path.join(root, f"d{t:02d}", f"s{s:02d}")
            os.makedirs(d, exist_ok=True)
            for i in range(per_dir):
                if made == n:
                    break
                fd = os.open(os.path.join(d, f"f{i:04d}"), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
                os.write(fd, payload)
                os.close(fd)
                made += 1
    print(f"{time.perf_counter() - start:.3f} {made}")


def stat_walk(root):
    start = time.perf_counter()
    count = 0
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            os.lstat(os.path.join(top, name))
            count += 1
    print(f"{time.perf_counter() - start:.3f} {count}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"fio-metrics": fio_metrics, "create": create, "stat-walk": stat_walk}[cmd](*args)
