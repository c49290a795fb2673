"""A quantized model is kept on disk after its first load, and a second load reads it instead of the
checkpoint: the same logits bit for bit, no quantizing. Other forward code never reads it."""
from __future__ import annotations

import pytest
import torch

from decoding.kernels import integer_linear, row_ops
from decoding.models import quantized_store, weights
from decoding.models.checkpoint import load_model


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_a_second_load_reads_the_kept_quantized_model(tiny_model_dir, tmp_path, monkeypatch, fmt):
    integer_linear.load(), row_ops.problem()  # the kernels as built in the usual home, before it moves
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path))
    ids = torch.tensor([5, 17, 42, 99, 7, 300, 12, 64])
    first = load_model(str(tiny_model_dir), weights=fmt)
    [kept] = (tmp_path / "quantized").glob("*.safetensors")
    assert weights.implementation(fmt) in kept.name

    def no_checkpoint(*args, **kwargs):
        raise AssertionError("the checkpoint was read again")

    with monkeypatch.context() as m:
        m.setattr("transformers.AutoModelForCausalLM.from_pretrained", no_checkpoint)
        second = load_model(str(tiny_model_dir), weights=fmt)
    with torch.inference_mode():
        assert torch.equal(first.model(ids, 0, len(ids)), second.model(ids, 0, len(ids)))
    assert type(second.model.embed) is type(first.model.embed)
    assert (second.model.embed.qweight is second.model.lm_head.qweight) == \
        (first.model.embed.qweight is first.model.lm_head.qweight)

    # another forward's code: the kept file is not read (the checkpoint is), and one of its own is kept
    monkeypatch.setattr(weights, "code_hash", lambda: "0" * 12)
    read: list[str] = []
    original = quantized_store.load
    monkeypatch.setattr(quantized_store, "load", lambda decoder, where: read.append(where.name) or original(decoder, where))
    load_model(str(tiny_model_dir), weights=fmt)
    assert read == [] and len(list((tmp_path / "quantized").glob(f"*{'0' * 12}.safetensors"))) == 1


def test_a_torn_kept_file_is_quantized_again(tiny_model_dir, tmp_path, monkeypatch):
    integer_linear.load(), row_ops.problem()
    monkeypatch.setenv("DRAFTWISE_HOME", str(tmp_path))
    load_model(str(tiny_model_dir), weights="int8")
    [kept] = (tmp_path / "quantized").glob("*.safetensors")
    kept.write_bytes(kept.read_bytes()[:1000])
    again = load_model(str(tiny_model_dir), weights="int8")
    assert again.model.lm_head.qweight.numel() > 0


@pytest.mark.parametrize("damage", ["huge header size", "header not a table", "offsets past the end"])
def test_a_damaged_kept_file_is_refused_not_mapped(tmp_path, damage):
    import json
    import struct

    from safetensors.torch import save_file

    where = tmp_path / "kept.safetensors"
    save_file({"w": torch.arange(8, dtype=torch.int32)}, str(where))
    assert torch.equal(quantized_store.mapped(where)[0]["w"], torch.arange(8, dtype=torch.int32))
    raw = where.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + size])
    if damage == "huge header size":
        raw = struct.pack("<Q", 1 << 62) + raw[8:]
    elif damage == "header not a table":
        body = json.dumps([1, 2]).encode().ljust(size)
        raw = raw[:8] + body + raw[8 + size:]
    else:
        header["w"]["data_offsets"] = [0, 36]  # 9 values where the file holds 8
        header["w"]["shape"] = [9]
        body = json.dumps(header, separators=(",", ":")).encode()
        assert len(body) <= size
        raw = raw[:8] + body.ljust(size) + raw[8 + size:]
    where.write_bytes(raw)
    with pytest.raises(ValueError):
        quantized_store.mapped(where)
