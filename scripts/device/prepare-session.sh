#!/usr/bin/env bash
# Build what scripts/device/session.sh runs and put it in .devbin/ (ignored by git): the release
# gdx, the GPU test binaries (release), the mailbox examples and the libfabric pack. Then:
#   run(command="bash scripts/device/session.sh tests", carry=[".devbin"]) and "... gpu".
set -euo pipefail
cd "$(dirname "$0")/../.."
EXCLUDE=$(git rev-parse --git-path info/exclude)
grep -qx '/.devbin/' "$EXCLUDE" 2>/dev/null || echo '/.devbin/' >>"$EXCLUDE"
rm -rf .devbin/tests .devbin/gdx .devbin/mailbox_child .devbin/mailbox_latency
mkdir -p .devbin/tests
cargo build --release -p gdx
cp target/release/gdx .devbin/
# mailbox_child: the child process of gdx-sys's mailbox kill test; mailbox_latency: gdx-bench's.
cargo build --release -p gdx-sys --example mailbox_child
cargo build --release -p gdx-bench --example mailbox_latency
cp target/release/examples/{mailbox_child,mailbox_latency} .devbin/
# The test binaries whose ignored tests need the GPU (plus each crate's unit tests).
TESTS=${TESTS:--p gdx-sys --lib --test cuda_gpu --test cuda_vmm_gpu --test cuda_mailbox_gpu \
  --test cuda_mailbox_kill}
ENGINE=${ENGINE:--p gdx-engine --lib --test gpu --test gpu_peer --test file --test mailbox}
OTHERS=${OTHERS:--p gdx-storage --lib --test storage_gpu --test storage_file_host}
for sel in "$TESTS" "$ENGINE" "$OTHERS" "-p gdx-stream --test pipeline_gpu" "-p gdx-nccl --test run" \
  "-p gdx --test cli_cp"; do
  # shellcheck disable=SC2086
  cargo test --release $sel --no-run --message-format=json 2>/dev/null |
    python3 scripts/device/test-bins.py --by-target
done
strip .devbin/gdx .devbin/mailbox_child .devbin/mailbox_latency .devbin/tests/* 2>/dev/null || true
[ -d .devbin/fabric ] || bash scripts/fabric-gpu-pack.sh
du -sh .devbin
