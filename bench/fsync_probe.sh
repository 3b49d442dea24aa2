#!/usr/bin/env bash
# One fsync-heavy probe of a uzfs build: 4 KiB random writes with an fsync
# after each for 8 s on a fresh 2 x 8 GiB mirror, with the daemon at
# UZFS_LOG=debug so the per-txg phase times (data, MOS, flush) can be
# set beside the fsync latency fio sees. Builds older than issue #12 log
# no phase times (their txg columns print 0).
#
# usage: bench/fsync_probe.sh BIN LABEL   (run two builds alternately)
U=$1; L=$2; D=/var/tmp/fp-$L
rm -rf $D; mkdir -p $D; truncate -s 8G $D/d0 $D/d1
export UZFS_RUNDIR=$D/run UZFS_LOG=debug
$U zpool create -f -m $D/mnt fp mirror $D/d0 $D/d1 >/dev/null
fio --name=l --ioengine=psync --direct=0 --filename=$D/mnt/g --size=64M --rw=read --bs=1M --create_only=1 --output=/dev/null; sync
fio --name=w --ioengine=psync --direct=0 --filename=$D/mnt/g --size=64M --rw=randwrite --bs=4k --runtime=8 --time_based=1 --fsync=1 --overwrite=1 --output-format=json --output=$D/w.json
python3 - $D $L <<'PY'
import json,re,statistics,sys
D,L=sys.argv[1],sys.argv[2]
j=json.load(open(f'{D}/w.json'))['jobs'][0]
d=[];m=[];f=[]
def us(x):
    v=float(re.match(r'[\d.]+',x).group())
    return v*1000 if x.endswith('ms') else (v if x.endswith('µs') else v*1e6)
for l in open(f'{D}/run/uzfsd.log'):
    mm=re.search(r'data ([\d.]+[µm]?s), mos ([\d.]+[µm]?s), flush ([\d.]+[µm]?s)',l)
    if mm: d.append(us(mm.group(1)));m.append(us(mm.group(2)));f.append(us(mm.group(3)))
print(f"{L}: iops {j['write']['iops']:.0f} fsync_mean_us {j['sync']['lat_ns']['mean']/1000:.0f} write_mean_us {j['write']['lat_ns']['mean']/1000:.0f} txgs {len(d)} data {statistics.median(d) if d else 0:.0f} mos {statistics.median(m) if m else 0:.0f} flush {statistics.median(f) if f else 0:.0f}")
PY
$U zpool destroy fp >/dev/null; $U daemon --stop >/dev/null; rm -rf $D
