#!/usr/bin/env bash
# Download and trim the peers' wheels that kv-peers.sh installs on the GPU machine (it has no
# network: they travel in the call's carry, 64 MiB in all), and optionally build gdx's wheel.
#
#   bash scripts/device/prepare-peers.sh [--out DIR] [--with-gdx]
#   run(carry=[".peers"], command="bash scripts/device/kv-peers.sh")
#
# DIR (default .peers, ignored by git through .git/info/exclude) receives:
#   kv/mooncake_transfer_engine_cuda13-0.3.14-cp312-*.whl   engine.so and what it loads (~9 MB)
#   kv/nixl-1.5.1-py3-none-any.whl                          the meta package (`import nixl`)
#   kv/nixl_cu13-1.5.1-cp312-*.whl                          the UCX plugin and UCX's cma and cuda
#                                                           modules only (~12 MB)
#   kv/oslibs.tar.gz   manylinux_2_28 builds of libnuma, libcurl, libibverbs, libmlx5 (and what
#                      they load) from the NIXL wheel: engine.so loads them from the OS, and
#                      kv-peers.sh puts these on LD_LIBRARY_PATH only for those the GPU image lacks
#   gdx/gdx-*.whl      with --with-gdx: the abi3 wheel (GDX_PY_WHEEL_ONLY=1 scripts/test-python.sh)
# Trimming: scripts/device/trim_wheel.py keeps the entry points named below and every library
# of the wheel they load, rewrites RECORD, and fails if a named file is gone (a new release).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$ROOT/.peers
WITH_GDX=
while (($#)); do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --with-gdx) WITH_GDX=1; shift ;;
    *) echo "prepare-peers: unknown argument $1 (usage: prepare-peers.sh [--out DIR] [--with-gdx])" >&2; exit 2 ;;
  esac
done
MOONCAKE=mooncake-transfer-engine-cuda13==0.3.14
NIXL=1.5.1
TRIM="python3 $ROOT/scripts/device/trim_wheel.py"
DL=$(mktemp -d /tmp/prepare-peers.XXXXXX)
trap 'rm -rf "$DL"' EXIT

# The GPU machine runs Python 3.12; pip picks the cp312 manylinux wheels whatever runs here.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 -d "$DL" "$MOONCAKE" "nixl==$NIXL" "nixl-cu13==$NIXL"
rm -rf "$OUT/kv" && mkdir -p "$OUT/kv"

mc=$(ls "$DL"/mooncake_transfer_engine_cuda13-*.whl)
# `from mooncake.engine import TransferEngine`: engine.so (libasio, libetcd_wrapper, glog,
# gflags, jsoncpp, yaml-cpp follow from it) and the NVLink allocator it may dlopen. Left out:
# the store (_store, mooncake_master, mooncake_client), ep and pg libraries, the bench binary.
$TRIM "$mc" "$OUT/kv/$(basename "$mc")" --keep 'mooncake/__init__.py' --keep 'mooncake/engine.so' \
  --keep 'mooncake/engine.pyi' --keep 'mooncake/py.typed' --keep 'mooncake/nvlink_allocator.so'

nx=$(ls "$DL"/nixl_cu13-*.whl)
# `from nixl._api import nixl_agent`: the bindings and the UCX plugin (libnixl, gRPC/etcd and
# UCX follow), UCX's cma (host memory across processes) and cuda (cuda_copy, cuda_ipc) modules.
# Left out: nixl_ep (three ~31 MB torch extensions), every other plugin, the duplicate plugin
# copies under nixl_cu13.libs/nixl/, UCX's ib modules (no RDMA NIC there), headers, scripts.
$TRIM "$nx" "$OUT/kv/$(basename "$nx")" --keep 'nixl_cu13/*.py' --keep 'nixl_cu13/py.typed' \
  --keep 'nixl_cu13/_bindings.*.so' --keep 'nixl_cu13/_utils.*.so' \
  --keep '.nixl_cu13.mesonpy.libs/plugins/libplugin_UCX.so' --keep 'nixl_cu13.libs/ucx/libuct_cma.*' \
  --keep 'nixl_cu13.libs/ucx/libuct_cuda.*' --keep 'nixl_cu13.libs/ucx/libucm_cuda.*'
cp "$DL"/nixl-"$NIXL"-py3-none-any.whl "$OUT/kv/"

# The OS libraries engine.so needs, as NIXL's wheel carries them (their names are auditwheel's;
# kv-peers.sh links the plain sonames to them where the system lacks one).
mkdir -p "$DL/oslibs"
python3 - "$nx" "$DL/oslibs" <<'PY'
import fnmatch, os, sys, zipfile
wheel, dst = sys.argv[1], sys.argv[2]
want = {"libnuma.so.1": "libnuma-*", "libcurl.so.4": "libcurl-*", "libibverbs.so.1": "libibverbs-*",
        "libmlx5.so.1": "libmlx5-*"}
deps = ("libzstd-*", "libnl-3-*", "libnl-route-3-*")  # what libcurl and libibverbs load by these names
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("nixl_cu13.libs/") and n.count("/") == 1]
    for soname, pat in [*want.items(), *((None, d) for d in deps)]:
        hit = [n for n in names if fnmatch.fnmatch(os.path.basename(n), pat)]
        if len(hit) != 1:
            sys.exit(f"prepare-peers: {os.path.basename(wheel)} has {len(hit)} files like {pat}, want 1")
        base = os.path.basename(hit[0])
        with open(os.path.join(dst, base), "wb") as f:
            f.write(z.read(hit[0]))
        os.chmod(os.path.join(dst, base), 0o755)
        if soname:
            os.symlink(base, os.path.join(dst, soname))
PY
tar czf "$OUT/kv/oslibs.tar.gz" -C "$DL/oslibs" .

if [[ -n $WITH_GDX ]]; then
  (cd "$ROOT" && GDX_PY_WHEEL_ONLY=1 bash scripts/test-python.sh)
  rm -rf "$OUT/gdx" && mkdir -p "$OUT/gdx" && cp "$ROOT"/target/wheels/gdx-*.whl "$OUT/gdx/"
  git -C "$ROOT" rev-parse --short=12 HEAD >"$OUT/gdx/COMMIT"  # the run header names it
fi
find "$OUT/kv" "$OUT/gdx" -maxdepth 1 -type f -printf '%10s  %p\n' 2>/dev/null || true
du -sh "$OUT/kv" | sed 's/^/prepare-peers: /'
