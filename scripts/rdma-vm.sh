#!/usr/bin/env bash
# A real verbs device on a machine without one: boots Debian's stock kernel under QEMU with
# Soft-RoCE (rdma_rxe), the host's / as the guest's root (read-only, a tmpfs overlay on top), and
# runs a command inside. The guest runs the host's binaries, test executables and venvs as they
# are, so build on the host and run inside.
#
#   scripts/rdma-vm.sh setup                  install QEMU, busybox, perftest, rdma-core from
#                                             Debian; unpack a kernel; build the initramfs;
#                                             find out whether KVM boots a guest here
#   scripts/rdma-vm.sh run [OPTS] -- CMD      one VM: rxe0 on dummy0 (192.0.2.1), paired with
#                                             itself; exits with CMD's status
#   scripts/rdma-vm.sh pair [OPTS] --a CMD --b CMD
#                                             two VMs ("two hosts") joined by --wires N virtual
#                                             Ethernet wires, rxeI on ethI of each (198.51.(100+I).1
#                                             in a, .2 in b); exits with a's status, and fails
#                                             if b's command failed before a ended
#
#   OPTS: --timeout S (default 1200: the VM is killed and the run fails), --mem MiB (2048),
#         --smp N (2), --wires N (pair; 1), --keep (keep the run folder)
#
# Inside, the command sees: GDX_VM (one|a|b), GDX_VM_NICS, GDX_VM_SELF_IP(S), GDX_VM_PEER_IP(S),
# GDX_VM_RUN (a folder both VMs and the host share, e.g. for one VM to signal the other),
# GDX_TEST_NIC (the first rxe device), GDX_VM_ACCEL (kvm|tcg), `ulimit -l unlimited`, and the
# caller's environment and working directory. Under TCG code runs 10-50x slower than on the
# host: compare figures only with a reference measured in the same boot.
#
# Files: $GDX_VM_DIR (default target/rdma-vm) holds the kernel, the initramfs and the runs.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
VMDIR="${GDX_VM_DIR:-$REPO/target/rdma-vm}"
mkdir -p "$VMDIR"
VMDIR="$(cd "$VMDIR" && pwd)"

die() { echo "rdma-vm: $*" >&2; exit 2; }

# The modules stage 1 needs to mount the host's root, with their dependencies first.
STAGE1_MODULES=(virtio virtio_ring virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci netfs
  fscache 9pnet 9pnet_virtio 9p overlay failover net_failover virtio_net)

kernel_version() { cat "$VMDIR/kernel.version" 2>/dev/null || true; }

setup() {
  local need=()
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
  [[ -x /bin/busybox ]] && /bin/busybox --list 2>/dev/null | grep -qx switch_root || need+=(busybox-static)
  command -v cpio >/dev/null || need+=(cpio)
  command -v depmod >/dev/null || need+=(kmod)
  command -v ib_write_bw >/dev/null || need+=(perftest)
  command -v rdma >/dev/null || need+=(iproute2)
  command -v ibv_devinfo >/dev/null || need+=(ibverbs-utils)
  compgen -G "/usr/lib/*/libibverbs/librxe-*" >/dev/null || need+=(ibverbs-providers)
  command -v tc >/dev/null || need+=(iproute2)
  # NVMe over Fabrics (suite-nvmeof.sh): the guests run the host's nvme-cli and mkfs.ext4.
  command -v nvme >/dev/null || need+=(nvme-cli)
  command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
  if ((${#need[@]})); then
    source "$(dirname "${BASH_SOURCE[0]}")/lib/apt.sh"
    apt_install rdma-vm "${need[@]}" || die "could not install ${need[*]}"
  fi
  if [[ -z $(kernel_version) || ! -f "$VMDIR/root/boot/vmlinuz-$(kernel_version)" ]]; then
    # Debian's newest stock 6.1 kernel: rdma_rxe and InfiniBand are modules there.
    local pkg
    pkg=$(apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$' | awk '{print $1}' | sort -V | tail -1)
    [[ -n $pkg ]] || die "no linux-image-6.1.0-N-amd64-unsigned package in the apt sources"
    echo "rdma-vm: unpacking $pkg" >&2
    rm -rf "$VMDIR/deb" "$VMDIR/root"; mkdir -p "$VMDIR/deb"
    (cd "$VMDIR/deb" && apt-get download "$pkg" >/dev/null 2>&1) || die "apt-get download $pkg failed"
    dpkg-deb -x "$VMDIR"/deb/*.deb "$VMDIR/root"
    local ver; ver=$(ls "$VMDIR/root/lib/modules" | head -1)
    depmod -b "$VMDIR/root" "$ver"
    echo "$ver" >"$VMDIR/kernel.version"
    rm -rf "$VMDIR/deb"
  fi
  build_initramfs
  detect_accel
  echo "rdma-vm: ready: kernel $(kernel_version), accel $(cat "$VMDIR/accel")" >&2
}

build_initramfs() {
  local ver mods dep order=() seen=" " m f
  ver=$(kernel_version)
  mods="$VMDIR/root/lib/modules/$ver"
  rm -rf "$VMDIR/initrd"; mkdir -p "$VMDIR/initrd"/{bin,modules,proc,sys,dev}
  cp /bin/busybox "$VMDIR/initrd/bin/busybox"
  for f in $(/bin/busybox --list); do [[ $f == busybox ]] || ln -sf busybox "$VMDIR/initrd/bin/$f"; done
  # modules.dep lists a module's dependencies, the deepest last: load them in reverse, then it.
  local line deps d
  for m in "${STAGE1_MODULES[@]}"; do
    line=$(grep -E "/${m}\.ko:" "$mods/modules.dep") || die "module $m not in kernel $ver"
    read -r -a deps <<<"${line#*:}"
    for ((d = ${#deps[@]} - 1; d >= -1; d--)); do
      if ((d >= 0)); then f=${deps[$d]}; else f=${line%%:*}; fi
      [[ $seen == *" $f "* ]] && continue
      seen+="$f "
      cp "$mods/$f" "$VMDIR/initrd/modules/"
      order+=("$(basename "$f")")
    done
  done
  printf '%s\n' "${order[@]}" >"$VMDIR/initrd/modules.list"
  install -m 0755 "$HERE/rdma-vm/init" "$VMDIR/initrd/init"
  (cd "$VMDIR/initrd" && find . | cpio -o -H newc 2>/dev/null | gzip -1) >"$VMDIR/initramfs.gz"
}

# KVM only where it really boots a guest: /dev/kvm can exist and accept KVM_CREATE_VM while every
# guest hangs in early boot (nested virtualisation), so boot one and see.
detect_accel() {
  local accel=tcg why="no usable /dev/kvm"
  if [[ -n ${GDX_VM_ACCEL:-} ]]; then
    accel=$GDX_VM_ACCEL why="GDX_VM_ACCEL"
  elif [[ -r /dev/kvm && -w /dev/kvm ]]; then
    if ACCEL=kvm boot_and_run one 1 40 "true" >/dev/null 2>&1; then
      accel=kvm why="a KVM guest booted and ran a command"
    else
      why="/dev/kvm is present but a KVM guest did not boot within 40 s (nested virtualisation)"
    fi
  fi
  echo "$accel" >"$VMDIR/accel"
  echo "$why" >"$VMDIR/accel.why"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# boot_and_run MODE WIRES TIMEOUT CMD_A [CMD_B]: MODE is one|pair.
boot_and_run() {
  local mode=$1 wires=$2 timeout=$3 cmd_a=$4 cmd_b=${5:-}
  local accel=${ACCEL:-$(cat "$VMDIR/accel" 2>/dev/null || echo tcg)}
  local ver; ver=$(kernel_version)
  [[ -f $VMDIR/initramfs.gz && -n $ver ]] || die "not set up: run scripts/rdma-vm.sh setup"
  local run; run=$(mktemp -d "$VMDIR/run.XXXXXX")
  export -p | grep -vE '^declare -x (PWD|OLDPWD|SHLVL|_|TMPDIR|HOSTNAME|TERM)=' >"$run/job.env" || true
  pwd >"$run/job.cwd"
  local vms=(one)
  [[ $mode == pair ]] && vms=(a b)
  printf '%s\n' "$cmd_a" >"$run/job.${vms[0]}"
  [[ $mode == pair ]] && printf '%s\n' "$cmd_b" >"$run/job.b"
  local accel_args=(-accel tcg,thread=multi -cpu max)
  [[ $accel == kvm ]] && accel_args=(-accel kvm -cpu host)
  local ports=() i
  for ((i = 0; i < wires; i++)); do ports+=("$(free_port)"); done
  local pids=() vm net
  for vm in "${vms[@]}"; do
    net=()
    if [[ $mode == pair ]]; then
      for ((i = 0; i < wires; i++)); do
        if [[ $vm == a ]]; then net+=(-netdev "socket,id=w$i,listen=127.0.0.1:${ports[$i]}")
        else net+=(-netdev "socket,id=w$i,connect=127.0.0.1:${ports[$i]}"); fi
        net+=(-device "virtio-net-pci,netdev=w$i,mac=52:54:00:00:$(printf %02x "$i"):$([[ $vm == a ]] && echo 01 || echo 02)")
      done
    else
      net=(-nic none)
    fi
    : >"$run/$vm.out"
    qemu-system-x86_64 "${accel_args[@]}" -smp "${SMP:-2}" -m "${MEM:-2048}" \
      -nographic -no-reboot -serial "file:$run/$vm.console" -monitor none \
      -kernel "$VMDIR/root/boot/vmlinuz-$ver" -initrd "$VMDIR/initramfs.gz" \
      -append "console=ttyS0 quiet panic=-1 gdx.guest=$HERE/rdma-vm/guest.sh gdx.run=$run gdx.vm=$vm gdx.wires=$wires gdx.kmod=$VMDIR/root/lib/modules/$ver gdx.accel=$accel" \
      -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
      -virtfs "local,path=$run,mount_tag=gdxrun,security_model=none" \
      "${net[@]}" </dev/null >"$run/$vm.qemu" 2>&1 &
    pids+=($!)
    # b connects to a's listening socket: give a's QEMU a moment to listen.
    [[ $mode == pair && $vm == a ]] && sleep 1
  done
  local first=${vms[0]}
  tail -n +1 -F "$run/$first.out" 2>/dev/null &
  local tailpid=$!
  local deadline=$((SECONDS + timeout)) rc=""
  while ((SECONDS < deadline)); do
    if [[ -f $run/$first.rc ]]; then rc=$(cat "$run/$first.rc"); break; fi
    if ! kill -0 "${pids[0]}" 2>/dev/null; then sleep 1; [[ -f $run/$first.rc ]] && rc=$(cat "$run/$first.rc"); break; fi
    if [[ $mode == pair && -f $run/b.rc && $(cat "$run/b.rc") != 0 ]]; then
      echo "rdma-vm: vm b's command failed (exit $(cat "$run/b.rc")) before a's ended" >&2
      rc=1; break
    fi
    sleep 0.5
  done
  sleep 0.3
  kill "$tailpid" 2>/dev/null || true
  for i in "${pids[@]}"; do kill "$i" 2>/dev/null || true; done
  wait "${pids[@]}" 2>/dev/null || true
  if [[ $mode == pair ]]; then
    echo "rdma-vm: ---- vm b's output ----"; cat "$run/b.out"
  fi
  if [[ -z $rc ]]; then
    if ((SECONDS >= deadline)); then echo "rdma-vm: timed out after ${timeout}s; VM killed" >&2
    else echo "rdma-vm: the VM stopped without running the command to its end" >&2; fi
    echo "rdma-vm: last console lines:" >&2; tail -20 "$run/$first.console" >&2 || true
    tail -5 "$run/$first.qemu" >&2 || true
    rc=124
  fi
  [[ -n ${KEEP:-} ]] && echo "rdma-vm: run folder kept: $run" >&2 || rm -rf "$run"
  return "$rc"
}

cmd=${1:-}; shift || true
TIMEOUT=1200 WIRES=1 CMD_A="" CMD_B=""
while (($#)); do
  case $1 in
    --timeout) TIMEOUT=$2; shift 2 ;;
    --mem) MEM=$2; shift 2 ;;
    --smp) SMP=$2; shift 2 ;;
    --wires) WIRES=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --a) CMD_A=$2; shift 2 ;;
    --b) CMD_B=$2; shift 2 ;;
    --) shift; CMD_A="$*"; break ;;
    *) die "unknown argument '$1' (see the comment at the top of $0)" ;;
  esac
done
case $cmd in
  setup) setup ;;
  run) [[ -n $CMD_A ]] || die "run needs a command: scripts/rdma-vm.sh run -- CMD"
       echo "rdma-vm: one VM, accel $(cat "$VMDIR/accel" 2>/dev/null) ($(cat "$VMDIR/accel.why" 2>/dev/null))" >&2
       boot_and_run one 1 "$TIMEOUT" "$CMD_A" ;;
  pair) [[ -n $CMD_A && -n $CMD_B ]] || die "pair needs --a CMD and --b CMD"
       echo "rdma-vm: two VMs, $WIRES wire(s), accel $(cat "$VMDIR/accel" 2>/dev/null) ($(cat "$VMDIR/accel.why" 2>/dev/null))" >&2
       boot_and_run pair "$WIRES" "$TIMEOUT" "$CMD_A" "$CMD_B" ;;
  *) die "usage: scripts/rdma-vm.sh setup | run [OPTS] -- CMD | pair [OPTS] --a CMD --b CMD" ;;
esac
