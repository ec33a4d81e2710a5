#!/usr/bin/env bash
# The one prepare script: builds or fetches here what scripts/device/run.sh's stages need on
# the GPU machine (which has no Rust and no network), into folders git ignores (through
# .git/info/exclude) that a device call carries.
#
#   bash scripts/device/prepare.sh WHAT...
#
#   bins     .devbin/: the release gdx, the examples the stages run (gpu_bench, peer_gpu_bench,
#            rdma_info, mailbox_child, mailbox_latency), every test binary of PKGS (default
#            --workspace; e.g. PKGS="-p gdx-sys -p gdx-engine") named <package>-<target>, and
#            COMMIT; run(carry=[".devbin"], command="bash scripts/device/run.sh views tests")
#   fabric   .devbin/fabric: the libfabric pack (scripts/fabric-gpu-pack.sh) for the fabric stage
#   peers    .peers/kv: the Mooncake TE and NIXL wheels, trimmed, and the OS libraries engine.so
#            loads (~22 MB), for the peers stage
#   ckpt     .peers/ckpt: the checkpoint loaders (InstantTensor, fastsafetensors, Run:ai
#            streamer) as wheels (~10 MB), for the ckpt stage
#   wheel    .peers/gdx: gdx's abi3 wheel (release) and COMMIT, for the peers and ckpt stages;
#            run(carry=[".peers"], command="bash scripts/device/run.sh peers")
#
# Trimming (peers): trim_wheel.py keeps the entry points named below and every library of the
# wheel they load, rewrites RECORD, and fails if a named file is gone (a new release).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
EXCLUDE=$(git rev-parse --git-common-dir)/info/exclude
ignore() { grep -qx "/$1/" "$EXCLUDE" 2>/dev/null || echo "/$1/" >>"$EXCLUDE"; }
commit() { echo "$(git rev-parse --short=12 HEAD)$(git diff --quiet HEAD || echo -dirty)"; }

bins() {
  ignore .devbin
  rm -rf .devbin/tests .devbin/gdx .devbin/COMMIT && mkdir -p .devbin/tests
  cargo build --release -p gdx
  cp target/release/gdx .devbin/
  # The engine GPU benches, the mailbox floors (gdx-bench examples), the RDMA discovery report
  # and the child process of gdx-sys's mailbox kill test.
  cargo build --release -p gdx-bench --example gpu_bench --example peer_gpu_bench \
    --example mailbox_latency -p gdx-rdma --example rdma_info -p gdx-sys --example mailbox_child
  cp target/release/examples/{gpu_bench,peer_gpu_bench,mailbox_latency,rdma_info,mailbox_child} .devbin/
  # shellcheck disable=SC2086
  cargo test ${PKGS:---workspace} --release --no-run --message-format=json 2>/dev/null |
    python3 scripts/device/test-bins.py --by-target
  strip .devbin/gdx .devbin/{gpu_bench,peer_gpu_bench,mailbox_latency,rdma_info,mailbox_child} \
    .devbin/tests/* 2>/dev/null || true
  commit >.devbin/COMMIT
  du -sh .devbin
}

fabric() {
  ignore .devbin
  bash scripts/fabric-gpu-pack.sh
}

# The GPU machine runs Python 3.12: pip picks the cp312 manylinux wheels whatever runs here.
PIP_DL=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp)

peers() {
  local out=.peers dl mc nx
  local mooncake=mooncake-transfer-engine-cuda13==0.3.14 nixl=1.5.1
  local trim="python3 $ROOT/scripts/device/trim_wheel.py"
  ignore .peers
  dl=$(mktemp -d /tmp/prepare-peers.XXXXXX)
  "${PIP_DL[@]}" --platform manylinux_2_28_x86_64 -d "$dl" "$mooncake" "nixl==$nixl" "nixl-cu13==$nixl"
  rm -rf "$out/kv" && mkdir -p "$out/kv"
  mc=$(ls "$dl"/mooncake_transfer_engine_cuda13-*.whl)
  # `from mooncake.engine import TransferEngine`: engine.so (libasio, libetcd_wrapper, glog,
  # gflags, jsoncpp, yaml-cpp follow from it) and the NVLink allocator it may dlopen. Left out:
  # the store (_store, mooncake_master, mooncake_client), ep and pg libraries, the bench binary.
  $trim "$mc" "$out/kv/$(basename "$mc")" --keep 'mooncake/__init__.py' --keep 'mooncake/engine.so' \
    --keep 'mooncake/engine.pyi' --keep 'mooncake/py.typed' --keep 'mooncake/nvlink_allocator.so'
  nx=$(ls "$dl"/nixl_cu13-*.whl)
  # `from nixl._api import nixl_agent`: the bindings and the UCX plugin (libnixl, gRPC/etcd and
  # UCX follow), UCX's cma (host memory across processes) and cuda (cuda_copy, cuda_ipc) modules.
  # Left out: nixl_ep (three ~31 MB torch extensions), every other plugin, the duplicate plugin
  # copies under nixl_cu13.libs/nixl/, UCX's ib modules (no RDMA NIC there), headers, scripts.
  $trim "$nx" "$out/kv/$(basename "$nx")" --keep 'nixl_cu13/*.py' --keep 'nixl_cu13/py.typed' \
    --keep 'nixl_cu13/_bindings.*.so' --keep 'nixl_cu13/_utils.*.so' \
    --keep '.nixl_cu13.mesonpy.libs/plugins/libplugin_UCX.so' --keep 'nixl_cu13.libs/ucx/libuct_cma.*' \
    --keep 'nixl_cu13.libs/ucx/libuct_cuda.*' --keep 'nixl_cu13.libs/ucx/libucm_cuda.*'
  cp "$dl"/nixl-"$nixl"-py3-none-any.whl "$out/kv/"
  # The OS libraries engine.so needs, as NIXL's wheel carries them (their names are
  # auditwheel's; the peers stage links the plain sonames to them where the system lacks one).
  mkdir -p "$dl/oslibs"
  python3 - "$nx" "$dl/oslibs" <<'PY'
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
            sys.exit(f"prepare peers: {os.path.basename(wheel)} has {len(hit)} files like {pat}, want 1")
        base = os.path.basename(hit[0])
        with open(os.path.join(dst, base), "wb") as f:
            f.write(z.read(hit[0]))
        os.chmod(os.path.join(dst, base), 0o755)
        if soname:
            os.symlink(base, os.path.join(dst, soname))
PY
  tar czf "$out/kv/oslibs.tar.gz" -C "$dl/oslibs" .
  rm -rf "$dl"
  find "$out/kv" -maxdepth 1 -type f -printf '%10s  %p\n'
}

ckpt() {
  ignore .peers
  mkdir -p .peers/ckpt
  # The versions issue 52's table was measured with (shared/reference/peers.md).
  "${PIP_DL[@]}" --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d .peers/ckpt \
    instanttensor==0.2.2 fastsafetensors==0.5.0 runai-model-streamer==0.17.1 humanize
  ls -la .peers/ckpt
}

wheel() {
  ignore .peers
  GDX_PY_WHEEL_ONLY=1 bash scripts/test-python.sh
  rm -rf .peers/gdx && mkdir -p .peers/gdx
  cp target/wheels/gdx-*.whl .peers/gdx/
  commit >.peers/gdx/COMMIT # the run header names it
  ls -la .peers/gdx
}

(($#)) || { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
for what in "$@"; do
  case $what in
    bins | fabric | peers | ckpt | wheel) "$what" ;;
    *) echo "prepare: no '$what' (bins, fabric, peers, ckpt, wheel)" >&2; exit 2 ;;
  esac
done
du -sh .devbin .peers 2>/dev/null || true
