#!/usr/bin/env bash
# Fetch the checkpoint loaders that scripts/device/ckpt.sh measures beside gdx (issue 52), as the
# cp312 manylinux x86-64 wheels the GPU machine installs without a network, into .peers/ckpt/
# (git-ignored through .git/info/exclude; a device call carries it: carry=[".peers"]).
#
#   bash scripts/device/prepare-ckpt.sh          # .peers/ckpt/*.whl (about 10 MB)
#
# The gdx wheel goes beside them in .peers/gdx/ (GDX_PY_WHEEL_ONLY=1 bash scripts/test-python.sh,
# then copy target/wheels/gdx-*.whl there): ckpt.sh takes the first gdx-*.whl it finds there.
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
ls -la "$DIR"
du -sh "$DIR"
