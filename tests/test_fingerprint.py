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


# --------------------------------------------------------------------------- digests a release keeps


def test_settings_digests_are_sha256_of_sorted_json_so_an_upgrade_keeps_outputs_current():
    """A manifest written by one run is compared with the next run's: the digest of the same settings must
    not depend on key order, and values JSON cannot hold (paths) are written as text."""
    from pathlib import Path

    from align.io.fingerprint import json_digest

    expected = hashlib.sha256(b'{"a": 2, "b": {"c": "runs/x", "d": [1, 2]}}').hexdigest()
    assert json_digest({"b": {"d": [1, 2], "c": Path("runs/x")}, "a": 2}) == expected
    assert weights_fingerprint("org/model") == hashlib.sha256(b'{"path": "org/model"}').hexdigest()


def test_a_checkpoint_fingerprint_is_each_weight_file_by_name_size_and_every_byte(checkpoint):
    from align.io.fingerprint import json_digest

    weights = checkpoint / "model.safetensors"
    by_hand = xxhash.xxh3_128(weights.read_bytes()).hexdigest()
    assert weights_fingerprint(checkpoint) == json_digest([["model.safetensors", weights.stat().st_size, by_hand]])


def test_a_wrapped_model_is_fingerprinted_by_the_model_it_wraps():
    """DDP and DeepSpeed engines hold the model as ``.module``: the same weights, the same fingerprint."""
    model = torch.nn.Linear(8, 4)

    class Engine(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.module = inner

    assert weights_fingerprint(Engine(Engine(model))) == weights_fingerprint(model)
    plain = torch.nn.Linear(8, 4)
    assert weights_fingerprint(Engine(plain)) != weights_fingerprint(model)


# --------------------------------------------------------------------------- hashed once within a run


@pytest.fixture(autouse=True)
def _no_run_open(monkeypatch):
    """Outside any run here: a stage an earlier test left raised keeps its block open for the process."""
    import align.io.fingerprint as fingerprint

    monkeypatch.setattr(fingerprint, "_MEMO", [])


def test_a_block_ends_its_own_memo_even_when_one_opened_after_it_was_never_closed(tmp_path):
    import align.io.fingerprint as fingerprint

    outer = fingerprint.remembered()
    outer.__enter__()
    left_open = fingerprint.remembered()
    left_open.__enter__()  # a run that raised and never ended
    kept = fingerprint._MEMO[1]
    outer.__exit__(None, None, None)
    assert fingerprint._MEMO == [kept] and fingerprint._MEMO[0] is kept


def test_within_a_run_a_file_is_hashed_once_until_it_changes(tmp_path):
    import os

    from align.io.fingerprint import HASHED, remembered

    path = tmp_path / "w.bin"
    path.write_bytes(b"a" * 1000)
    first = xxhash.xxh3_128(b"a" * 1000).hexdigest()
    start = len(HASHED)
    with remembered():
        assert file_digest(path) == first and file_digest(path) == first
        assert HASHED[start:] == [str(path)]  # the second read was the remembered digest
        path.write_bytes(b"b" * 1000)  # same size; its times change
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
        assert file_digest(path) == xxhash.xxh3_128(b"b" * 1000).hexdigest()
        with remembered():  # an inner block remembers on its own and forgets at its end
            assert file_digest(path) == xxhash.xxh3_128(b"b" * 1000).hexdigest()
        assert file_digest(path) == xxhash.xxh3_128(b"b" * 1000).hexdigest()
    assert HASHED[start:] == [str(path)] * 3
    assert file_digest(path) == xxhash.xxh3_128(b"b" * 1000).hexdigest()  # outside a run: hashed every time
    assert HASHED[start:] == [str(path)] * 4


def test_the_hash_log_lists_every_full_hash_with_its_rank(tmp_path, monkeypatch):
    """ALIGN_HASH_LOG: how the distributed tests see which rank hashed what (appended, one line a file)."""
    log = tmp_path / "hashed.log"
    log.write_text("1 earlier\n")
    monkeypatch.setenv("ALIGN_HASH_LOG", str(log))
    monkeypatch.setenv("RANK", "3")
    for name in ("a.bin", "b.bin"):
        (tmp_path / name).write_bytes(name.encode())
        file_digest(tmp_path / name)
    monkeypatch.delenv("RANK")
    file_digest(tmp_path / "a.bin")
    assert log.read_text() == f"1 earlier\n3 {tmp_path / 'a.bin'}\n3 {tmp_path / 'b.bin'}\n0 {tmp_path / 'a.bin'}\n"


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "model.pth", "model.safetensors"])
def test_every_weight_format_is_fingerprinted(tmp_path, name):
    """A checkpoint saved as .bin (or a .pt/.pth state dict) is weights like a .safetensors file."""
    directory = tmp_path / "ckpt"
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    (directory / name).write_bytes(b"\x00" * 64)
    before = weights_fingerprint(directory)
    (directory / name).write_bytes(b"\x00" * 63 + b"\x01")
    assert weights_fingerprint(directory) != before
