"""The weights fingerprint sees every byte: of a weight file on disk, and of a model in memory.

The fingerprint decides whether a finished reference log-prob pass (and a finished stage) is
reused, so a change it misses is a silently wrong result. The old scheme hashed a file's size
and 16 windows of 64 KiB, and every 4096th element of an in-memory model: these tests change
exactly what it skipped.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
import xxhash
from safetensors.torch import save_file

from align.io.fingerprint import file_digest, files_fingerprint, weights_fingerprint

SIZE = 12 << 20  # over 8 MiB: 16 windows of 64 KiB cover 1 MiB of it


def _old_window_starts(total: int, samples: int = 16, size: int = 1 << 16) -> list[int]:
    return [max(0, (total - size) * k // max(1, samples - 1)) for k in range(samples)]


def _unsampled_offset(total: int) -> int:
    """A byte the old scheme never read: midway between its first two windows."""
    starts = _old_window_starts(total)
    offset = (starts[0] + (1 << 16) + starts[1]) // 2
    assert all(not (s <= offset < s + (1 << 16)) for s in starts)
    return offset


@pytest.fixture()
def checkpoint(tmp_path):
    """A checkpoint directory with a 12 MiB model.safetensors (plus a config, not weights)."""
    generator = torch.Generator().manual_seed(0)
    tensors = {"embed.weight": torch.randn(SIZE // 4 // 1024, 1024, generator=generator)}
    directory = tmp_path / "ckpt"
    directory.mkdir()
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert (directory / "model.safetensors").stat().st_size > 8 << 20
    return directory


def test_one_byte_between_the_old_windows_changes_the_fingerprint(checkpoint):
    weights = checkpoint / "model.safetensors"
    before = weights_fingerprint(checkpoint)
    offset = _unsampled_offset(weights.stat().st_size)
    with open(weights, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x01]))
    assert weights_fingerprint(checkpoint) != before
    assert weights_fingerprint(str(checkpoint)) == weights_fingerprint(checkpoint)


def test_files_outside_the_weights_do_not_count_and_every_weight_file_does(checkpoint):
    before = weights_fingerprint(checkpoint)
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "llama", "note": 1}))
    assert weights_fingerprint(checkpoint) == before
    save_file({"extra": torch.zeros(3)}, str(checkpoint / "adapter_model.safetensors"))
    assert weights_fingerprint(checkpoint) != before


def test_file_digest_is_xxh3_128_of_every_byte(tmp_path):
    """Checked against a one-shot hash of the whole file, at a size that spans several read chunks."""
    path = tmp_path / "blob.bin"
    data = torch.randint(0, 256, (40 << 20,), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    path.write_bytes(data.numpy().tobytes())
    assert file_digest(path) == xxhash.xxh3_128(path.read_bytes()).hexdigest()
    expected = hashlib.sha256(json.dumps([["blob.bin", 40 << 20, file_digest(path)]]).encode()).hexdigest()
    assert files_fingerprint([path]) == expected


def test_one_element_of_an_in_memory_model_changes_the_fingerprint():
    """An element the old every-4096th sample skipped, in a tensor of over 4096 elements."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 8))
    before = weights_fingerprint(model)
    assert weights_fingerprint(model) == before
    with torch.no_grad():
        flat = model[0].weight.view(-1)
        step = max(1, flat.numel() // 4096)
        assert step > 1
        flat[step + 1] += 1e-6  # not a multiple of the old step
    assert weights_fingerprint(model) != before


def test_a_model_object_is_hashed_by_its_tensors_not_by_the_files_it_came_from(tmp_path, tiny_model):
    """Trained in memory after loading, a model is not its checkpoint any more."""
    import copy

    model = copy.deepcopy(tiny_model)
    model.save_pretrained(tmp_path / "saved")
    model.name_or_path = str(tmp_path / "saved")
    before = weights_fingerprint(model)
    with torch.no_grad():
        next(model.parameters()).view(-1)[7] += 1.0
    assert weights_fingerprint(model) != before


def test_bfloat16_tensors_are_hashed_by_their_bits():
    a = torch.nn.Linear(64, 64).to(torch.bfloat16)
    before = weights_fingerprint(a)
    with torch.no_grad():
        bits = a.weight.view(torch.int16).view(-1)
        bits[100] ^= 1  # the lowest mantissa bit of one element
    assert weights_fingerprint(a) != before


def test_a_hub_name_is_fingerprinted_by_name():
    assert weights_fingerprint("org/model") != weights_fingerprint("org/other")
    assert weights_fingerprint("org/model") == weights_fingerprint("org/model")
