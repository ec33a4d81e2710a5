#!/usr/bin/env bash
# Fetch the checkpoint loaders that scripts/device/ckpt.sh measures beside gdx (issue 52), as the
# cp312 manylinux x86-64 wheels the GPU machine installs without a network, into .peers/ckpt/
# (git-ignored through .git/info/exclude; a device call carries it: carry=[".peers"]).
#
#   bash scripts/device/prepare-ckpt.sh          # .peers/ckpt/*.whl (about 10 MB)
#   bash scripts/device/prepare-ckpt.sh --gdx    # and gdx's wheel (release, abi3) in .peers/gdx/,
#                                                # with the commit it was built from in COMMIT
# ckpt.sh takes the first gdx-*.whl it finds in .peers/gdx/.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.peers/' .git/info/exclude 2>/dev/null || echo '/.peers/' >>"$(git rev-parse --git-common-dir)/info/exclude"
DIR=.peers/ckpt
mkdir -p "$DIR"
# The versions issue 52's table was measured with (shared/reference/peers.md).
PEERS=(instanttensor==0.2.2 fastsafetensors==0.5.0 runai-model-streamer==0.17.1 humanize)
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d "$DIR" "${PEERS[@]}"
if [[ "${1:-}" == "--gdx" ]]; then
  GDX_PY_WHEEL_ONLY=1 bash scripts/test-python.sh
  rm -rf .peers/gdx && mkdir -p .peers/gdx
  cp target/wheels/gdx-*.whl .peers/gdx/
  echo "$(git rev-parse --short=12 HEAD)$(git diff --quiet HEAD || echo -dirty)" >.peers/gdx/COMMIT
fi
ls -la .peers/*
du -sh .peers
