"""Checkpoints into real models: ``gdx.load_model`` (a ``torch.nn.Module``'s own storage, in
place), ``load_safetensors(out=state_dict)`` into torch tensors and selective loading by name
patterns, against files the ``safetensors`` package writes. The module cases run on host memory
wherever torch imports (the GPU machine; PyPI's Linux torch needs CUDA's libraries to import,
so a CPU-only machine skips them and says why); the GPU cases also check that no GPU memory
beyond the model's is used and that pinned memory stays within its bound. The same logic on
numpy state dicts is in test_safetensors.py. No test asserts a speed.
"""

import json

import numpy as np
import pytest

import gdx

from conftest import cuda_reason


def _torch():
    try:
        import torch

        return torch, None
    except Exception as e:  # PyPI's torch raises ValueError, not ImportError, without CUDA's libraries
        return None, f"torch does not import here ({type(e).__name__}: {str(e)[:120]})"


torch, _why = _torch()
if torch is None:
    pytest.skip(_why, allow_module_level=True)
import safetensors.torch as stt  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self, vocab=50, dim=24, out=7, tie=False):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.fc = torch.nn.Linear(dim, out)
        self.norm = torch.nn.LayerNorm(out)
        self.head = torch.nn.Linear(dim, vocab, bias=False)
        self.register_buffer("scale", torch.arange(out, dtype=torch.float64))
        self.lowp = torch.nn.Parameter(torch.randn(3, 5).to(torch.bfloat16))
        if tie:
            self.head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        return self.norm(self.fc(x)) * self.scale.float() + self.head(x).sum(-1, keepdim=True)


def saved(tmp_path, seed=1, **kw):
    torch.manual_seed(seed)
    m = Net(**kw)
    p = tmp_path / "model.safetensors"
    sd = {k: v.detach().contiguous() for k, v in m.state_dict().items()}
    if kw.get("tie"):
        sd.pop("head.weight")  # save_pretrained stores a tied weight once
    stt.save_file(sd, str(p))
    return m, p


def test_a_module_loads_in_place_with_equal_outputs(tmp_path):
    ref, p = saved(tmp_path)
    torch.manual_seed(2)
    m = Net()
    ptrs = {k: v.data_ptr() for k, v in m.state_dict().items()}
    missing, unexpected, reports = gdx.load_model(m, p, return_report=True)
    assert missing == [] and unexpected == []
    for k, v in ref.state_dict().items():
        got = m.state_dict()[k]
        assert got.dtype == v.dtype and torch.equal(got, v), k
        assert got.data_ptr() == ptrs[k], f"{k} was replaced, not loaded in place"
    ids = torch.randint(0, 50, (4, 9))
    assert torch.equal(m(ids), ref(ids))
    assert sum(r["bytes"] for r in reports) == sum(v.nbytes for v in ref.state_dict().values())


def test_mismatched_shapes_and_dtypes_are_refused_by_name_before_any_byte_moves(tmp_path):
    _, p = saved(tmp_path)
    torch.manual_seed(3)
    m = Net(out=8)  # fc, norm and scale are one longer
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(gdx.Error) as e:
        gdx.load_model(m, p)
    msg = str(e.value)
    for name in ("fc.weight", "fc.bias", "norm.weight", "scale"):
        assert f"module[{name!r}]" in msg, msg
    assert "(8, 24)" in msg and "(7, 24)" in msg, msg
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k]), f"{k} changed although the load was refused"
    m = Net()
    m.lowp.data = m.lowp.data.float()
    with pytest.raises(gdx.Error, match=r"module\['lowp'\] is \(3, 5\) torch.float32 but the checkpoint has \(3, 5\) torch.bfloat16"):
        gdx.load_model(m, p)


def test_strict_names_missing_and_unexpected_tensors(tmp_path):
    ref, p = saved(tmp_path)
    m = Net()
    m.extra = torch.nn.Linear(2, 2)
    with pytest.raises(gdx.Error, match=r"missing from the checkpoint: 'extra.bias', 'extra.weight'"):
        gdx.load_model(m, p)
    missing, unexpected = gdx.load_model(m, p, strict=False)
    assert missing == ["extra.bias", "extra.weight"] and unexpected == []
    assert torch.equal(m.fc.weight, ref.fc.weight)
    small = torch.nn.Module()
    small.fc = torch.nn.Linear(24, 7)
    with pytest.raises(gdx.Error, match="not in the module: 'embed.weight'"):
        gdx.load_model(small, p)
    missing, unexpected = gdx.load_model(small, p, strict=False)
    assert missing == [] and "head.weight" in unexpected and "fc.weight" not in unexpected
    assert torch.equal(small.fc.bias, ref.fc.bias)


def test_tied_weights_stored_once_count_as_loaded(tmp_path):
    ref, p = saved(tmp_path, tie=True)
    torch.manual_seed(9)
    m = Net(tie=True)
    assert gdx.load_model(m, p) == ([], [])
    assert torch.equal(m.head.weight, ref.embed.weight)
    assert m.head.weight.data_ptr() == m.embed.weight.data_ptr()


def test_name_patterns_select_tensors(tmp_path):
    ref, p = saved(tmp_path)
    got = gdx.load_safetensors(p, framework="pt", names=["fc.*", "sca?e"])
    assert sorted(got) == ["fc.bias", "fc.weight", "scale"]
    for k, v in got.items():
        assert torch.equal(v, ref.state_dict()[k]), k
    with pytest.raises(gdx.Error, match=r"the pattern 'layers\.\*' matches none of the checkpoint's 8 tensors"):
        gdx.load_safetensors(p, names="layers.*")
    torch.manual_seed(4)
    m = Net()
    embed_before = m.embed.weight.clone()
    assert gdx.load_model(m, p, names="fc.*") == ([], [])
    assert torch.equal(m.fc.weight, ref.fc.weight) and torch.equal(m.embed.weight, embed_before)


def test_a_state_dict_is_filled_in_place_from_a_sharded_index(tmp_path):
    ref, _ = saved(tmp_path)
    sd = {k: v.detach().contiguous() for k, v in ref.state_dict().items()}
    names = sorted(sd)
    weight_map = {}
    for i, part in enumerate((names[:3], names[3:])):
        f = f"model-{i + 1:05d}-of-00002.safetensors"
        stt.save_file({k: sd[k] for k in part}, str(tmp_path / f))
        weight_map.update({k: f for k in part})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    out = {k: torch.zeros_like(v) for k, v in sd.items() if k != "scale"}
    got = gdx.load_safetensors(index, framework="pt", out=out)
    for k in out:
        assert got[k] is out[k] and torch.equal(out[k], sd[k]), k
    assert torch.equal(got["scale"], sd["scale"])  # not in out: a view of the pool
    # A numpy state dict too; a wrong one is refused by name.
    np_out = {"fc.weight": np.zeros((7, 24), np.float32)}
    got = gdx.load_safetensors(index, out=np_out, names="fc.weight")
    assert got["fc.weight"] is np_out["fc.weight"]
    assert np.array_equal(np_out["fc.weight"], sd["fc.weight"].numpy())
    with pytest.raises(gdx.Error, match=r"out\['fc.bias'\] is \(6,\) float32 but the checkpoint has \(7,\) float32"):
        gdx.load_safetensors(index, out={"fc.bias": np.zeros(6, np.float32)})
    with pytest.raises(gdx.Error, match=r"out\['fc.bias'\] is not contiguous"):
        gdx.load_safetensors(index, out={"fc.bias": np.zeros(14, np.float32)[::2]})


@pytest.mark.gpu
@pytest.mark.skipif(cuda_reason() is not None, reason=str(cuda_reason()))
def test_gpu_module_loads_in_place_within_the_memory_bounds(tmp_path):
    ref, p = saved(tmp_path)
    ref = ref.cuda()
    torch.manual_seed(5)
    m = Net().cuda()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    ptrs = {k: v.data_ptr() for k, v in m.state_dict().items()}
    missing, unexpected, reports = gdx.load_model(m, p, return_report=True)
    torch.cuda.synchronize()
    # No GPU memory beyond the model's own: nothing allocated, not even for a moment.
    assert torch.cuda.max_memory_allocated() == before
    assert (missing, unexpected) == ([], [])
    for k, v in ref.state_dict().items():
        assert torch.equal(m.state_dict()[k], v), k
        assert m.state_dict()[k].data_ptr() == ptrs[k], k
    load = reports[0]["load"]
    bound = load["readers"] * load["buffers"] * load["chunk_bytes"]
    assert 0 < load["pinned_bytes"] <= bound, load
    assert load["warm"] in ("readers", "register") and load["warm_why"], load
    ids = torch.randint(0, 50, (4, 9), device="cuda")
    assert torch.equal(m(ids), ref(ids))


@pytest.mark.gpu
@pytest.mark.skipif(cuda_reason() is not None, reason=str(cuda_reason()))
@pytest.mark.parametrize("warm", ["readers", "register"])
def test_gpu_warm_methods_load_equal_bytes(tmp_path, monkeypatch, warm):
    monkeypatch.setenv("GDX_CKPT_WARM", warm)
    monkeypatch.setenv("GDX_CKPT_CHUNK", "1M")
    g = torch.Generator().manual_seed(52)
    want = {f"t{i}": torch.randn(int(n), generator=g).to(torch.bfloat16)
            for i, n in enumerate([1, 4095, 1 << 20, (3 << 20) + 7])}
    p = tmp_path / "w.safetensors"
    stt.save_file(want, str(p))
    seen = []
    got, reports = gdx.load_safetensors(p, device="cuda:0", via="buffered", return_report=True,
                                        progress=lambda d, t: seen.append((d, t)))
    total = sum(v.nbytes for v in want.values())
    assert seen and max(seen) == (total, total), seen[-3:]
    for k, v in want.items():
        assert torch.equal(got[k].cpu(), v), k
    load = reports[0]["load"]
    assert load["warm"] == warm and "GDX_CKPT_WARM" in load["warm_why"], load
    assert reports[0]["registered"] == (warm == "register"), reports[0]
    assert load["pinned_bytes"] <= load["readers"] * load["buffers"] * (1 << 20)


@pytest.mark.gpu
@pytest.mark.skipif(cuda_reason() is not None, reason=str(cuda_reason()))
def test_gpu_tensors_are_saved_straight_from_the_gpu(tmp_path):
    g = torch.Generator(device="cuda").manual_seed(52)
    want = {
        "big": torch.randn((5 << 20) + 3, generator=g, device="cuda").to(torch.bfloat16),
        "strided": torch.randn(64, 48, generator=g, device="cuda").t(),  # not contiguous
        "ids": torch.arange(1001, device="cuda", dtype=torch.int64),
        "empty": torch.zeros(0, 4, device="cuda"),
        "scalar": torch.tensor(2.5, device="cuda"),
    }
    p = tmp_path / "g.safetensors"
    r = gdx.save_safetensors(want, p, metadata={"step": "7"}, chunk_bytes=1 << 20)
    assert "pinned" in r["reason"], r["reason"]
    back = stt.load_file(str(p))
    assert sorted(back) == sorted(want)
    for k, v in want.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape, k
        assert torch.equal(back[k], v.cpu()), k
