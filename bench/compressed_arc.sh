#!/usr/bin/env bash
# The compressed ARC's trade (issue #16): a 1 GiB file that lz4 packs to
# about 320 MiB (fio buffer_compress_percentage=70), `arc_max` 512 MiB, read
# with O_DIRECT so that every read reaches the daemon: RT s of 4 KiB random
# reads, then (the ARC emptied) RT s of 4 KiB sequential reads. Prints
# IOPS, MiB/s, daemon CPU s, and what the ARC held at the end (all of the
# file compressed, or half of it decompressed).
#
# usage: bench/compressed_arc.sh BIN     env: RT [15]
# Interleave builds or settings by hand, for example
#   for i in 1 2 3; do bench/compressed_arc.sh A; bench/compressed_arc.sh B;
#     UZFS_COMPRESSED_ARC=0 bench/compressed_arc.sh B; done
set -eu
U=$(realpath "$1"); D=/var/tmp/cprobe
export UZFS_RUNDIR=$D/run UZFS_ARC_MAX=$((512<<20))
$U daemon --stop >/dev/null 2>&1 || true
rm -rf $D; mkdir -p $D; truncate -s 8G $D/d0
$U zpool create -f -m $D/mnt cp $D/d0 >/dev/null
$U zfs set compression=lz4 cp
fio --name=w --ioengine=psync --filename=$D/mnt/f --size=1G --rw=write --bs=1M --refill_buffers=1 \
    --buffer_compress_percentage=70 --buffer_compress_chunk=4k --end_fsync=1 --output=/dev/null
$U zinject -a cp >/dev/null; sync; echo 3 > /proc/sys/vm/drop_caches
PID=$(cat $UZFS_RUNDIR/uzfsd.pid)
c0=$(awk -v hz=$(getconf CLK_TCK) '{print ($14+$15)/hz}' /proc/$PID/stat)
fio --name=r --ioengine=psync --direct=1 --filename=$D/mnt/f --size=1G --rw=randread --bs=4k \
    --time_based=1 --runtime=${RT:-15} --output-format=json --output=$D/r.json
c1=$(awk -v hz=$(getconf CLK_TCK) '{print ($14+$15)/hz}' /proc/$PID/stat)
$U zinject -a cp >/dev/null
fio --name=s --ioengine=psync --direct=1 --filename=$D/mnt/f --size=1G --rw=read --bs=4k \
    --time_based=1 --runtime=${RT:-15} --output-format=json --output=$D/s.json
sleep 1.2
python3 -c "import json;j=json.load(open('$D/r.json'))['jobs'][0]['read'];s=json.load(open('$D/s.json'))['jobs'][0]['read'];print('rand4k iops %.0f seq4k MiB/s %.0f'%(j['iops'], s['bw']/1024), end=' ')"
echo "cpu $(awk -v a=$c0 -v b=$c1 'BEGIN{print b-a}') arc_data $(awk '$1=="data_size"{print int($3/1048576)}' $UZFS_RUNDIR/arcstats)MiB size $(awk '$1=="size"{print int($3/1048576)}' $UZFS_RUNDIR/arcstats)MiB used $($U zfs get -Hp -o value used,logicalused cp | tr '\n' ' ')"
$U daemon --stop >/dev/null 2>&1 || true
rm -rf $D
