#!/bin/bash
# Stage 2 of the RDMA VM: runs from the host's tree (mounted read-only under a tmpfs overlay).
# Mounts what a normal system has, brings up the Soft-RoCE devices, runs the job that
# scripts/rdma-vm.sh wrote into the run folder, records its exit status there, and powers off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
param() { sed -n "s/.*gdx\.$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
RUN=$(param run)
VM=$(param vm)
WIRES=$(param wires)
KMOD=$(param kmod)
ACCEL=$(param accel)

poweroff_now() { sync; echo o >/proc/sysrq-trigger; sleep 10; }
trap poweroff_now EXIT

mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /dev/shm /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t devpts devpts /dev/pts
mkdir -p "$RUN"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 gdxrun "$RUN" || {
  echo "rdma-vm guest: cannot mount the run folder $RUN"; exit 1; }

log="$RUN/$VM.out"
exec >>"$log" 2>&1
echo "rdma-vm: vm $VM up ($(uname -r), accel $ACCEL, $(nproc) vCPUs)"

# The unpacked kernel's modules, where modprobe looks for them.
mkdir -p "/lib/modules/$(uname -r)"
mount --bind "$KMOD" "/lib/modules/$(uname -r)"
# crc32_generic first: without it rxe refuses every netdev ("rdma_rxe: failed to add").
for m in crc32_generic crc32-pclmul ib_core ib_uverbs rdma_ucm rdma_rxe dummy virtio_net sch_netem sch_tbf; do
  modprobe "$m" || echo "rdma-vm: modprobe $m failed"
done

ip link set lo up
nics=()
if [[ $VM == one ]]; then
  # One kernel: rxe0 on a dummy netdev, paired with itself (Soft-RoCE in 6.1 carries no
  # traffic between two rxe devices of one kernel).
  # MTU 9000: RoCE's path MTU is then 4096, as on a tuned fabric (doctor's `mtu` checks it).
  ip link add dummy0 mtu 9000 type dummy
  ip addr add 192.0.2.1/24 dev dummy0
  ip link set dummy0 up
  rdma link add rxe0 type rxe netdev dummy0
  nics=(rxe0)
  self_ips=(192.0.2.1)
  peer_ips=(192.0.2.1)
else
  host=1 peer=2
  [[ $VM == b ]] && host=2 peer=1
  self_ips=() peer_ips=()
  for ((i = 0; i < WIRES; i++)); do
    ip link set "eth$i" mtu 9000
    ip addr add "198.51.$((100 + i)).$host/24" dev "eth$i"
    ip link set "eth$i" up
    rdma link add "rxe$i" type rxe netdev "eth$i"
    nics+=("rxe$i")
    self_ips+=("198.51.$((100 + i)).$host")
    peer_ips+=("198.51.$((100 + i)).$peer")
  done
fi
# The ports come up ACTIVE within a second of the netdev.
for ((t = 0; t < 50; t++)); do
  rdma link show 2>/dev/null | grep -q 'state DOWN' || break
  sleep 0.2
done
rdma link show

ulimit -l unlimited
ulimit -n 65536
# GDX_VM_RUN: the run folder, shared by both VMs and the host (a place to signal each other).
export GDX_VM="$VM" GDX_VM_ACCEL="$ACCEL" GDX_VM_NICS="${nics[*]}" GDX_VM_RUN="$RUN"
export GDX_VM_SELF_IPS="${self_ips[*]}" GDX_VM_PEER_IPS="${peer_ips[*]}"
export GDX_VM_SELF_IP="${self_ips[0]}" GDX_VM_PEER_IP="${peer_ips[0]}" GDX_TEST_NIC="${nics[0]}"
echo "rdma-vm: nics ${nics[*]}, self ${self_ips[*]}, peer ${peer_ips[*]}"
echo "rdma-vm: ---- job ----"

# shellcheck disable=SC1090
(source "$RUN/job.env"; cd "$(cat "$RUN/job.cwd")" && exec bash "$RUN/job.$VM")
rc=$?
echo "rdma-vm: ---- job exit $rc ----"
echo "$rc" >"$RUN/$VM.rc.tmp" && mv "$RUN/$VM.rc.tmp" "$RUN/$VM.rc"
