#!/usr/bin/env bash
# Third GPU-machine run: every test binary (GPU tests included: GPU regions over a Peer, VMM fd
# sharing, borrowed raw streams, gdx-sys VMM), the Peer GPU bench (tcp-staged and ipc through a
# Peer against host tcp and LocalPeer p2p, same run), `gdx doctor`, `gdx bench --path rdma` and
# RDMA discovery. Binaries from `bash scripts/device/prepare.sh` in .devbin/.
# Results: $OUT/peer.tgz and $OUT/summary.txt.
. "$(dirname "$0")/env.sh"
R=$OUT W="$OUT/work" S="$OUT/summary.txt" TGZ="$OUT/peer.tgz"
mkdir -p "$W"
GDX=$PWD/.devbin/gdx
export CARGO_BIN_EXE_gdx="$GDX" GDX_TEST_GPU=0
echo "date: $(date -u +%FT%TZ) host: $(hostname)" | tee -a "$S"
nvidia-smi -L | tee -a "$S"
# cuFile needs udev's ID_FS_USAGE for the file system's device; this VM has no udev database.
MAJMIN=$(lsblk -no MAJ:MIN "$(findmnt -no SOURCE -T /tmp)" 2>/dev/null | head -1 | tr -d ' ')
if [ -n "$MAJMIN" ] && ! grep -qs ID_FS_USAGE /run/udev/data/b$MAJMIN; then
  mkdir -p /run/udev/data && printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$(findmnt -no FSTYPE -T /tmp)" >>/run/udev/data/b$MAJMIN
  echo "udev: wrote ID_FS_USAGE for $MAJMIN" | tee -a "$S"
fi
step peer-gpu-bench 180 .devbin/peer_gpu_bench
for t in .devbin/tests/*; do step "test-$(basename "$t" | sed 's/-[0-9a-f]*$//')" 150 "$t" --include-ignored; done
step doctor 60 "$GDX" doctor
step doctor-json 60 "$GDX" doctor --json
step bench-rdma 60 "$GDX" bench --path rdma
step bench-rdma-json 60 "$GDX" bench --path rdma --json
step rdma-info 30 .devbin/rdma_info
grep -hE "^test result|FAILED|panicked" "$W"/test-*.log >>"$S"
grep -h '"key"' "$W/peer-gpu-bench.log" >>"$S"
tar czf "$R/peer.tgz" -C "$W" . && rm -rf "$W"
