"""Reading the KV layout off vLLM-shaped tensors (no engine): the CPU backend's one tensor per
layer carved out of one storage, and a GPU backend's K and V apart (two segments)."""

import pytest
import torch

import gdx
from gdx.vllm import layout_of

GEOM = dict(block_size=32, num_kv_heads=2, head_size=64)


def test_cpu_layout_one_storage_one_segment_per_layer():
    n = 10
    storage = torch.zeros(2 * n * 2 * 32 * 128, dtype=torch.float32)
    kv = {f"l{i}": storage[i * n * 8192 : (i + 1) * n * 8192].view(n, 2, 32, 128) for i in range(2)}
    lay, storages = layout_of(kv, num_blocks=n, **GEOM)
    assert len(storages) == 1
    assert lay.block_bytes == 2 * 32 * 128 * 4
    assert lay.tensor_layout == "(num_blocks, 2, 32, 128) block dim 0"
    assert lay.segments == [[["gdx-vllm.kv.0", 0, lay.block_bytes]],
                            [["gdx-vllm.kv.0", n * lay.block_bytes, lay.block_bytes]]]


def test_split_kv_layout_two_segments():
    n = 6  # flash-attention's (2, num_blocks, block_size, heads, head_size)
    kv = {"l0": torch.zeros(2, n, 32, 2, 64), "l1": torch.zeros(2, n, 32, 2, 64)}
    lay, storages = layout_of(kv, num_blocks=n, **GEOM)
    bb = 32 * 2 * 64 * 4
    assert len(storages) == 2 and lay.segments_per_layer == 2
    assert lay.segments[1] == [["gdx-vllm.kv.1", 0, bb], ["gdx-vllm.kv.1", n * bb, bb]]


def test_non_contiguous_block_is_refused():
    t = torch.zeros(4, 32, 2, 64).transpose(1, 2)  # blocks not contiguous
    with pytest.raises(gdx.Error, match="a block is not contiguous"):
        layout_of({"l0": t}, num_blocks=4, **GEOM)


def test_no_block_dimension_is_refused():
    with pytest.raises(gdx.Error, match="no dimension of num_blocks=7"):
        layout_of({"l0": torch.zeros(4, 2, 32, 64)}, num_blocks=7, **GEOM)
