#!/usr/bin/env bash
# Issue 52's checkpoint benchmark on the GPU machine, in one run of under 9 minutes: gdx's
# checkpoint loader (its default and each warm candidate) beside safetensors, InstantTensor,
# fastsafetensors and the Run:ai streamer, warm and cold, on file A (4 GiB, 256 x 16 MiB) and
# file B (a Llama-8B-shaped bf16 slice, 72 tensors, two shards and an index); the raw O_DIRECT
# read and the pinned copy as floor and ceiling; saves of 4 GiB of GPU tensors; a transformers
# round trip. ckpt.py says what each row is; every loaded byte is checked.
#
# Prepared here (nothing is built or downloaded there):
#   bash scripts/device/prepare.sh ckpt wheel    # .peers/ckpt/*.whl (peers), .peers/gdx/gdx-*.whl
#   run(carry=[".peers"], command="bash scripts/device/run.sh ckpt")             # the full run
#   run(carry=[".peers"], command="bash scripts/device/run.sh ckpt -- --quick")  # a smoke run (~2 min)
# Arguments after `--` go to ckpt.py (--rows "gdx,InstantTensor BUFFERED" runs only those load rows).
# Results: $OUT/ckpt.md (tables and checks), $OUT/ckpt.json (every figure), $OUT/ckpt-log.txt,
# $OUT/ckpt-tests.txt (the Python checkpoint tests on this GPU, run first).
# GDX_BENCH_DIR: the scratch folder (default /tmp/gdx-ckpt; on a disk, not tmpfs, for the cold
# rows to mean anything). Needs root for drop_caches (the GPU machine gives it).
. "$(dirname "$0")/../env.sh"
DIR=${GDX_BENCH_DIR:-/tmp/gdx-ckpt}
SITE=$(mktemp -d /tmp/ckpt-site.XXXX)
gdx_wheel=$(ls .peers/gdx/gdx-*.whl 2>/dev/null | head -1)
peers=$(ls .peers/ckpt/*.whl 2>/dev/null)
if [ -z "$gdx_wheel" ] || [ -z "$peers" ]; then
  echo "ckpt: needs .peers/gdx/gdx-*.whl and .peers/ckpt/*.whl carried (see the top of this script)" >&2
  exit 2
fi
# A plain pip install into the system Python fails quietly there: install into a folder of our own.
python3 -m pip install -q --no-index --no-deps --target "$SITE" $gdx_wheel $peers >"$OUT/ckpt-pip.txt" 2>&1 ||
  { log "ckpt: pip install of the carried wheels failed (see ckpt-pip.txt)"; exit 2; }
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export GDX_COMMIT=${GDX_COMMIT:-$(cat .peers/gdx/COMMIT 2>/dev/null || echo unknown)}
log "ckpt: $(nvidia-smi -L | head -1); gdx $(basename "$gdx_wheel") at $GDX_COMMIT; scratch $DIR"
python3 -c 'import torch, transformers, safetensors; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 | tee -a "$OUT/log.txt"
if python3 -c 'import pytest' 2>/dev/null; then
  (cd crates/python/tests && timeout 120 python3 -m pytest -q -p no:cacheprovider -rs \
    test_safetensors.py test_load_model.py) >"$OUT/ckpt-tests.txt" 2>&1
  log "checkpoint tests: rc=$? ($(tail -1 "$OUT/ckpt-tests.txt"))"
else
  log "checkpoint tests: not run (no pytest here)"
fi
rm -rf "$DIR" && mkdir -p "$DIR"
timeout 500 python3 "$(dirname "$0")/../ckpt.py" --dir "$DIR" --out "$OUT" "$@" 2>&1 | tee "$OUT/ckpt-log.txt"
rc=${PIPESTATUS[0]}
rm -rf "$DIR" "$SITE"
exit "$rc"
