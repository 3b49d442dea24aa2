#!/bin/sh
# POSIX ACL behaviour, printed step by step: run as root in a directory of
# the filesystem under test (world-traversable path), once on ext4 and once
# on uzfs with acltype=posix; tests/fs.rs requires the two transcripts to be
# identical. Users 1001-1003 and groups 1002, 5000 need not exist.
# Each step prints the command, its output and its exit status.
set -u
mkdir w && cd w || exit 1

# as UID CMD...: run as an unprivileged user (group 3000, no others);
# asg UID GID CMD...: the same with GID as a supplementary group.
as() { u=$1; shift; setpriv --reuid "$u" --regid 3000 --clear-groups "$@"; }
asg() { u=$1; g=$2; shift 2; setpriv --reuid "$u" --regid 3000 --groups "$g" "$@"; }
t() {
  echo "\$ $*"
  out=$("$@" 2>&1)
  rc=$?
  [ -n "$out" ] && printf '%s\n' "$out"
  echo "rc=$rc"
}
create() { python3 -c "import os,sys; os.close(os.open(sys.argv[1], os.O_CREAT|os.O_WRONLY, int(sys.argv[2], 8)))" "$@"; }

umask 022

echo "## named entries and the mask"
mkdir d
t setfacl -m u:1001:rwx,g:1002:rwx d
t getfacl d
t stat -c %a d
t as 1001 touch d/a
t as 1003 touch d/b
t asg 1003 1002 touch d/c
t chmod 750 d
t getfacl d
t as 1001 touch d/e
t as 1001 ls d
t setfacl -m m::rwx d
t stat -c %a d
t as 1001 touch d/e

echo "## files: read through a named entry, removal"
touch f
chmod 640 f
echo secret > f
t setfacl -m u:1001:r f
t stat -c %a f
t as 1001 cat f
t as 1003 cat f
t setfacl -x u:1001 f
t getfacl f
t as 1001 cat f
t setfacl -m g:1002:rw f
t asg 1003 1002 sh -c 'echo more >> f'
t cat f
t chmod 604 f
t getfacl f
t asg 1003 1002 sh -c 'echo again >> f'

echo "## an ACL the mode says all of is not kept"
t setfacl -m u::rw,g::r,o::- f
t setfacl -b f
t getfacl f
t stat -c %a f
touch plain
t setfacl -m u::rwx,g::rx,o::x plain
t getfacl plain
t stat -c %a plain

echo "## default ACLs: inherited, umask ignored, mode masked"
mkdir dd
t setfacl -d -m u:1001:rwx,g::rx,o::- dd
t getfacl dd
umask 077
touch dd/f1
create dd/f2 600
create dd/f3 755
mkdir dd/s1
mkfifo dd/p1
ln -s nowhere dd/l1
umask 022
t getfacl dd/f1 dd/f2 dd/f3 dd/s1 dd/p1
t stat -c '%a %n' dd/f1 dd/f2 dd/f3 dd/s1 dd/p1
t as 1001 touch dd/s1/x
t as 1002 touch dd/s1/y
t getfacl dd/s1/x
mkdir dd/s1/deeper
t getfacl dd/s1/deeper
t setfacl -d -m u:1:r f
t setfacl -k dd
t getfacl dd
t setfacl -k d
umask 022
touch dd/after
t stat -c %a dd/after

echo "## who may set an ACL"
t as 1001 setfacl -m u:1003:r f
chown 1001 f
t as 1001 setfacl -m u:1003:r f
t as 1001 chmod 600 f
t getfacl f

echo "## setting an ACL drops set-group-ID outside the group"
touch g1 g2
chown 1001:5000 g1 g2
chmod 2775 g1 g2
t as 1001 setfacl -m u:1003:r g1
t asg 1001 5000 setfacl -m u:1003:r g2
t stat -c '%a %n' g1 g2

echo "## search permission through an ACL"
mkdir x
chmod 700 x
echo inside > x/in
chmod 644 x/in
t setfacl -m u:1001:x x
t as 1001 cat x/in
t as 1001 ls x
t as 1002 cat x/in

echo "## copies keep ACLs"
t cp -a dd/f1 copy
t getfacl copy
t getfacl dd dd/* dd/s1/*
