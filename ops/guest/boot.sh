#!/bin/bash
# rdmalog lab: runs inside the guest, chrooted into the host's root (read-only over 9p).
#
# 1. Reads the run's settings from /mnt/.lab/env.sh (written by the host tool).
# 2. Brings up the fabric: per host i a veth pair v$i/b$i, b$i on bridge br0, v$i at
#    192.0.2.1$i/24 with an rxe$i device on it, and per-host policy routing so that
#    host-to-host traffic really crosses the veths (RDMA-NOTES §1); every veth end gets a
#    pass-through netem root qdisc for the fault hooks to change.
# 3. Mounts the optional ext4 disk at /run/lab/disk.
# 4. Prints "@@LAB:READY", runs the job, and records its exit status in /mnt/.lab/rc.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp LANG=C.UTF-8
# shellcheck source=/dev/null
. /mnt/.lab/env.sh

fail() {
  echo "@@LAB:ERROR $*"
  dmesg > /mnt/.lab/dmesg.txt 2>/dev/null
  exit 97
}

# Keep the console for the job's output: kernel messages go to /mnt/.lab/dmesg.txt at the end.
dmesg -n 1 2>/dev/null
ulimit -l unlimited || fail "cannot raise the memlock limit"
ulimit -n 65536 2>/dev/null
hostname rdmalog-lab 2>/dev/null
ip link set lo up || fail "cannot bring up lo"

echo "@@LAB:STAGE fabric"
setsys() { echo "$2" > "/proc/sys/$1" || fail "cannot set sysctl $1=$2"; }
for k in all default; do
  setsys net/ipv4/conf/$k/accept_local 1
  setsys net/ipv4/conf/$k/rp_filter 0
done
ip link add br0 type bridge || fail "cannot create bridge br0 (bridge module missing?)"
ip link set br0 up
for i in $(seq 1 "$LAB_HOSTS"); do
  addr="192.0.2.1$i"
  ip link add "v$i" type veth peer name "b$i" || fail "cannot create veth pair v$i/b$i"
  ip link set "b$i" master br0 || fail "cannot attach b$i to br0"
  ip link set "b$i" up
  ip addr add "$addr/24" dev "v$i" || fail "cannot assign $addr to v$i"
  ip link set "v$i" up || fail "cannot bring up v$i"
  setsys "net/ipv4/conf/v$i/accept_local" 1
  setsys "net/ipv4/conf/v$i/rp_filter" 0
  setsys "net/ipv4/conf/v$i/arp_ignore" 1
  setsys "net/ipv4/conf/v$i/arp_announce" 2
  ip route add 192.0.2.0/24 dev "v$i" src "$addr" table "10$i" || fail "cannot add route table 10$i"
  ip rule add pref "10$i" from "$addr" iif lo lookup "10$i" || fail "cannot add rule 10$i"
  # A pass-through netem as the root qdisc of both veth ends: the fault hooks (lab::guest)
  # only ever `tc qdisc change` it. Grafting a qdisc later drops the packets sent while the
  # kernel swaps them, and rxe turns a dropped MAD into a dead QP1 (rdma_cm gone on that host).
  for dev in "v$i" "b$i"; do
    tc qdisc add dev "$dev" root netem limit 10000 \
      || fail "cannot add the pass-through netem qdisc on $dev (sch_netem missing?)"
  done
  rdma link add "rxe$i" type rxe netdev "v$i" || fail "rdma link add rxe$i on v$i failed (rdma_rxe not loaded?)"
done
ip rule add pref 1000 lookup local || fail "cannot move the local rule"
ip rule del pref 0 || fail "cannot delete rule 0"

# Static neighbour entries between every pair of hosts. All addresses belong to one kernel, so
# an ARP reply for a peer can be delivered locally instead of crossing the bridge; without
# these, whichever rxe host transmitted first to an unresolved peer saw its packets vanish
# (rdma_cm requests never arrived) until the peer had transmitted once.
for i in $(seq 1 "$LAB_HOSTS"); do
  for j in $(seq 1 "$LAB_HOSTS"); do
    [ "$i" = "$j" ] && continue
    mac=$(cat "/sys/class/net/v$j/address") || fail "cannot read the MAC of v$j"
    ip neigh replace "192.0.2.1$j" lladdr "$mac" dev "v$i" nud permanent \
      || fail "cannot add a neighbour entry for 192.0.2.1$j on v$i"
  done
done

# Wait for every rxe port to be ACTIVE with a RoCE v2 IPv4 GID (bounded: 15 s).
for i in $(seq 1 "$LAB_HOSTS"); do
  ok=
  for _ in $(seq 1 150); do
    state=$(cat "/sys/class/infiniband/rxe$i/ports/1/state" 2>/dev/null)
    case "$state" in
      *ACTIVE*)
        if grep -qs "RoCE v2" /sys/class/infiniband/rxe$i/ports/1/gid_attrs/types/* &&
           grep -qs "^0000:0000:0000:0000:0000:ffff:c000:02" /sys/class/infiniband/rxe$i/ports/1/gids/*; then
          ok=1; break
        fi ;;
    esac
    sleep 0.1
  done
  [ -n "$ok" ] || fail "rxe link rxe$i would not come up (port state: ${state:-none}; no RoCE v2 IPv4 GID within 15 s)"
done

if [ -n "${LAB_DISK:-}" ]; then
  echo "@@LAB:STAGE disk"
  mkdir -p /run/lab/disk
  mount -t ext4 /dev/vda /run/lab/disk || fail "cannot mount the ext4 disk image (/dev/vda) at /run/lab/disk"
  export RDMALOG_LAB_DISK=/run/lab/disk
fi

# Paths the job needs that live under the host's /tmp (hidden by the guest's tmpfs): bind the
# top-level directory of each back, read-only like the rest of the host root.
for p in "$LAB_CWD" ${LAB_KEEP:-}; do
  case "$p" in
    /tmp/?*)
      top=${p#/tmp/}; top=${top%%/*}
      if [ ! -e "/tmp/$top" ] && [ -e "/run/lab/host-tmp/$top" ]; then
        mkdir -p "/tmp/$top"
        mount --bind "/run/lab/host-tmp/$top" "/tmp/$top" || fail "cannot bind the host's /tmp/$top into the guest"
      fi ;;
  esac
done

export RDMALOG_LAB=1 RDMALOG_LAB_HOSTS="$LAB_HOSTS" RDMALOG_LAB_OUT=/mnt RDMALOG_LAB_SCRATCH=/tmp
echo "@@LAB:READY uptime=$(cut -d' ' -f1 /proc/uptime)"
cd "$LAB_CWD" || fail "cannot enter $LAB_CWD in the guest"
bash /mnt/.lab/job.sh
rc=$?
cd /
if [ -n "${LAB_DISK:-}" ]; then sync; umount /run/lab/disk 2>/dev/null; fi
dmesg > /mnt/.lab/dmesg.txt 2>/dev/null
echo "$rc" > /mnt/.lab/rc
sync
echo "@@LAB:EXIT $rc"
exit 0
