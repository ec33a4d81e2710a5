#!/usr/bin/env bash
# Issue 51's peer benchmark on the GPU machine: installs the carried wheels (Mooncake TE, NIXL,
# gdx) into a scratch folder, then runs kv_peers.py (torch, Mooncake nvlink_intra, NIXL UCX and
# gdx moving KV blocks and single buffers between two processes on one GPU, bytes checked).
#
# Prepared here (the GPU machine has no network and no Rust), then carried:
#   bash scripts/device/prepare.sh peers wheel          # .peers/kv (~22 MB) and .peers/gdx
#   run(carry=[".peers"], command="bash scripts/device/run.sh peers")
# The `peers` stage: run.sh peers -- [--gdx-wheel WHL] [--peers DIR] [kv_peers.py options: --quick,
#   --only ROWS, --iters N, --seed S, --timeout SECONDS]
# WHL defaults to the one .peers/gdx/gdx-*.whl, DIR to .peers/kv. Results: $OUT/kv-peers.md (the
# tables and the acceptance lines), $OUT/kv-peers.json (every row and the run's header),
# $OUT/kv-peers.txt (the console), $OUT/logs/LIB.log (each library's pair).
. "$(dirname "$0")/../env.sh"
PEERS=.peers/kv
GDX_WHEEL=
while (($#)); do
  case $1 in
    --gdx-wheel) GDX_WHEEL=$2; shift 2 ;;
    --peers) PEERS=$2; shift 2 ;;
    *) break ;;
  esac
done
if [[ -z $GDX_WHEEL ]]; then
  GDX_WHEEL=$(ls .peers/gdx/gdx-*.whl 2>/dev/null | head -1)
fi
if ! ls "$PEERS"/*.whl >/dev/null 2>&1; then
  echo "kv-peers: no wheels in $PEERS: run \`scripts/device/prepare.sh peers wheel\` here and carry .peers" >&2
  exit 2
fi
SITE=$(mktemp -d /tmp/kv-peers-site.XXXXXX)
trap 'rm -rf "$SITE"' EXIT
wheels=("$PEERS"/*.whl)
if [[ -n $GDX_WHEEL ]]; then
  wheels+=("$GDX_WHEEL")
  [[ -f $(dirname "$GDX_WHEEL")/COMMIT ]] && export GDX_COMMIT=${GDX_COMMIT:-$(cat "$(dirname "$GDX_WHEEL")/COMMIT")}
else
  log "kv-peers: no gdx wheel (.peers/gdx/gdx-*.whl or --gdx-wheel): the gdx rows will report it"
fi
# A plain `pip install` into the system Python fails quietly there: install into a folder.
python3 -m pip install -q --no-index --no-deps --target "$SITE" "${wheels[@]}" || exit 2
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

# engine.so loads libnuma, libcurl, libibverbs and libmlx5 from the OS: supply from oslibs.tar.gz
# (manylinux_2_28 builds) only the ones this image lacks, and say which.
LIBS=$SITE/.oslibs
mkdir -p "$LIBS"
SYSLIBS=$(ldconfig -p 2>/dev/null || true)
has_lib() { grep -qE "^[[:space:]]+${1//./\\.} " <<<"$SYSLIBS"; }
if [[ -f $PEERS/oslibs.tar.gz ]]; then
  tar xzf "$PEERS/oslibs.tar.gz" -C "$LIBS"
  for so in libnuma.so.1 libcurl.so.4 libibverbs.so.1 libmlx5.so.1; do
    if has_lib "$so"; then rm -f "${LIBS:?}/$so"; else log "kv-peers: $so from the carried oslibs (the image has none)"; fi
  done
fi
# libcudart.so.13 (engine.so, UCX's cuda module): torch's CUDA runtime wheel where the OS has none.
if ! has_lib libcudart.so.13; then
  rt=$(python3 -c 'import glob, os, sys
hits = [h for p in sys.path for h in glob.glob(os.path.join(p, "nvidia", "*", "lib", "libcudart.so.13"))]
print(os.path.dirname(hits[0]) if hits else "")')
  if [[ -n $rt ]]; then LIBS=$LIBS:$rt; log "kv-peers: libcudart.so.13 from $rt"; else log "kv-peers: no libcudart.so.13 found (Mooncake will not load)"; fi
fi
export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

log "kv-peers: $(nvidia-smi -L 2>/dev/null | head -1); wheels: $(cd "$(dirname "${wheels[0]}")" && ls -- *.whl | tr '\n' ' ')${GDX_WHEEL:+ + $(basename "$GDX_WHEEL")}"
python3 "$(dirname "$0")/../kv_peers.py" --out "$OUT" "$@" 2>&1 | tee "$OUT/kv-peers.txt"
exit "${PIPESTATUS[0]}"
