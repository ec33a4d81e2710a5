#!/usr/bin/env bash
# Second GPU-machine run: the engine's GPU and file tests, the full `gdx bench` sweep including ipc
# (second process) and the engine's staged path, `gdx bench --path file`, and `gdx calibrate`.
# Binaries from `bash scripts/device/prepare.sh` in .devbin/. Results: $OUT/final.tgz + summary.
. "$(dirname "$0")/env.sh"
FINAL_OUT=$OUT W="$OUT/work" S="$OUT/summary.txt" TGZ="$OUT/final.tgz"
mkdir -p "$W"
GDX=$PWD/.devbin/gdx
export CARGO_BIN_EXE_gdx="$GDX" GDX_TEST_GPU=0
# cuFile needs udev's ID_FS_USAGE for the file system's device; this VM has no udev database
# (see scripts/device/storage-gpu.sh and `gdx doctor`'s cufile/udev finding).
MAJMIN=$(lsblk -no MAJ:MIN "$(findmnt -no SOURCE -T /tmp)" 2>/dev/null | head -1 | tr -d ' ')
if [ -n "$MAJMIN" ] && ! grep -qs ID_FS_USAGE /run/udev/data/b$MAJMIN; then
  mkdir -p /run/udev/data && printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$(findmnt -no FSTYPE -T /tmp)" >>/run/udev/data/b$MAJMIN
  echo "udev: wrote ID_FS_USAGE for $MAJMIN" | tee -a "$S"
fi
for t in .devbin/tests/*; do step "test-$(basename "$t" | cut -d- -f1)" 120 "$t" --include-ignored; done
step bench 200 "$GDX" bench --path pinned-ce,pageable-ce,p2p,staged,ipc --duration 100ms --max-samples 200 \
  --export-json "$W/h200x2.json" --export-csv "$W/h200x2.csv" --plot "$W/h200x2.svg"
step bench-file 100 "$GDX" bench --path file --size 16MiB:1GiB:x4 --iters 3 --file-dir /tmp \
  --export-json "$W/h200x2-file.json"
step calibrate 70 "$GDX" calibrate -o "$W/calibration.json"
"$GDX" calibrate --show -o "$W/calibration.json" >"$W/calibrate-show.txt" 2>&1
grep -hE "^test result|FAILED|panicked" "$W"/test-*.log >>"$S"
tar czf "$FINAL_OUT/final.tgz" -C "$W" . && rm -rf "$W"
