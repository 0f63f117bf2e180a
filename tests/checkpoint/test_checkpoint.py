"""Checkpoint directories (`sinkdlm.io.files`, `sinkdlm.checkpoint.manager`): round trips, dtype/device, the
`transformers.AutoModelForMaskedLM` route, one `CheckpointError` naming the file for every bad
input, and atomic saves (a crash mid-write leaves the previous checkpoint loadable).
"""

from __future__ import annotations

import json
import os
import random
import stat

import pytest
import safetensors.torch
import torch
from safetensors.torch import load_file, save_file

import sinkdlm  # noqa: F401  (registers AutoModelForMaskedLM)
from sinkdlm import CheckpointError, DiffusionLM, ModelConfig


def tiny(**kw) -> ModelConfig:
    base = dict(
        vocab_size=67, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64, qkv_bias=True,
        initializer_range=0.2,  # large weights: a wrong tensor would change the logits visibly
    )
    return ModelConfig(**{**base, **kw})


def make(seed: int = 0, **kw) -> DiffusionLM:
    torch.manual_seed(seed)
    return DiffusionLM(tiny(**kw)).eval()


IDS = torch.randint(0, 67, (2, 9), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def logits(model, ids=IDS):
    return model(ids).logits


def saved(tmp_path, **kw):
    model = make(**kw)
    model.save_pretrained(tmp_path / "ckpt")
    return model, tmp_path / "ckpt"


VARIANTS = {
    "tied": dict(),
    "untied": dict(tie_word_embeddings=False),
    "sink-front": dict(num_sink_tokens=1),
    "sinks-end-untied": dict(num_sink_tokens=2, sink_position="end", tie_word_embeddings=False),
    "gated+sink": dict(gated_attention=True, num_sink_tokens=1),
    "zero-value+gated": dict(num_sink_tokens=4, sink_zero_value=True, gated_attention=True),
}


# ----------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_save_load_same_logits(tmp_path, variant):
    model, ckpt = saved(tmp_path, **VARIANTS[variant])
    loaded = DiffusionLM.from_pretrained(ckpt)
    assert loaded.config == model.config
    assert not loaded.training
    torch.testing.assert_close(logits(loaded), logits(model), atol=0, rtol=0)
    # Every parameter is real (nothing left on the meta device) and equal.
    for (name, p), (_, q) in zip(model.named_parameters(), loaded.named_parameters()):
        assert q.device.type == "cpu", name
        torch.testing.assert_close(q, p, atol=0, rtol=0)
    stored = load_file(str(ckpt / "model.safetensors"))
    tied = model.config.tie_word_embeddings
    assert ("lm_head.weight" in stored) != tied  # a tied head is stored once
    assert (loaded.lm_head.weight is loaded.embed_tokens.weight) == tied


def test_loaded_model_trains_and_stays_tied(tmp_path):
    _, ckpt = saved(tmp_path)
    model = DiffusionLM.from_pretrained(ckpt).train()
    model(IDS).logits.sum().backward()
    assert model.embed_tokens.weight.grad is not None
    assert model.lm_head.weight is model.embed_tokens.weight


def test_tokenizer_files_are_saved_beside(tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]")),
        unk_token="[UNK]", mask_token="[MASK]",
    )
    model = make()
    model.save_pretrained(tmp_path / "ckpt", tokenizer=tok)
    again = AutoTokenizer.from_pretrained(str(tmp_path / "ckpt"))
    assert again.mask_token_id == tok.mask_token_id == 3
    torch.testing.assert_close(logits(DiffusionLM.from_pretrained(tmp_path / "ckpt")), logits(model), atol=0, rtol=0)  # round trip


@pytest.mark.parametrize("dtype", [torch.bfloat16, "bfloat16", "torch.float16"])
def test_dtype_argument(tmp_path, dtype):
    model, ckpt = saved(tmp_path, num_sink_tokens=1)
    want = dtype if isinstance(dtype, torch.dtype) else getattr(torch, dtype.removeprefix("torch."))
    loaded = DiffusionLM.from_pretrained(ckpt, dtype=dtype)
    assert loaded.dtype == want and all(p.dtype == want for p in loaded.parameters())
    out = logits(loaded)
    assert out.dtype == want
    torch.testing.assert_close(out.float(), logits(model), atol=0.1, rtol=0.05)


def test_dtype_auto_keeps_the_stored_dtype_and_device_argument(tmp_path):
    model = make().to(torch.bfloat16)
    model.save_pretrained(tmp_path / "ckpt")
    assert DiffusionLM.from_pretrained(tmp_path / "ckpt").dtype == torch.bfloat16
    assert DiffusionLM.from_pretrained(tmp_path / "ckpt", dtype="auto").dtype == torch.bfloat16
    loaded = DiffusionLM.from_pretrained(tmp_path / "ckpt", device="cpu", dtype=torch.float32)
    assert loaded.device == torch.device("cpu") and loaded.dtype == torch.float32
    meta = DiffusionLM.from_pretrained(tmp_path / "ckpt", device="meta")
    assert meta.device.type == "meta"


def test_bad_dtype_is_a_value_error(tmp_path):
    _, ckpt = saved(tmp_path)
    with pytest.raises(ValueError, match="'float33' is not one of float32, bfloat16, float16"):
        DiffusionLM.from_pretrained(ckpt, dtype="float33")
    with pytest.raises(ValueError, match="'int8' is not one of float32, bfloat16, float16"):
        DiffusionLM.from_pretrained(ckpt, dtype="int8")


def test_automodel_for_masked_lm(tmp_path):
    from transformers import AutoConfig, AutoModelForMaskedLM

    model, ckpt = saved(tmp_path, num_sink_tokens=1, gated_attention=True, tie_word_embeddings=False)
    auto = AutoModelForMaskedLM.from_pretrained(str(ckpt))
    assert isinstance(auto, DiffusionLM)
    assert not hasattr(DiffusionLM, "config_class")  # registered through the public API, nothing set on the class
    torch.testing.assert_close(logits(auto), logits(model), atol=0, rtol=0)
    hf_cfg = AutoConfig.from_pretrained(str(ckpt))
    assert hf_cfg.model_type == "sinkdlm"
    assert hf_cfg.to_model_config().replace(extra={}) == model.config.replace(extra={})
    half = AutoModelForMaskedLM.from_pretrained(str(ckpt), dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16
    assert AutoModelForMaskedLM.from_pretrained(str(ckpt), dtype="auto").dtype == torch.float32


# ----------------------------------------------------------------------------- bad inputs
def expect_error(ckpt, names):
    with pytest.raises(CheckpointError) as exc:
        DiffusionLM.from_pretrained(ckpt)
    assert isinstance(exc.value, ValueError)
    assert str(names) in str(exc.value), str(exc.value)
    return str(exc.value)


def edit_config(ckpt, **changes):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(changes)
    (ckpt / "config.json").write_text(json.dumps(cfg))


def test_error_missing_directory(tmp_path):
    msg = expect_error(tmp_path / "nope", tmp_path / "nope")
    assert "does not exist" in msg


def test_error_missing_config(tmp_path):
    _, ckpt = saved(tmp_path)
    (ckpt / "config.json").unlink()
    assert "save_pretrained" in expect_error(ckpt, ckpt / "config.json")


@pytest.mark.parametrize("text", ["{not json", "", "\xff\xfe garbage", "[1, 2]", '"a string"'])
def test_error_config_not_a_json_object(tmp_path, text):
    _, ckpt = saved(tmp_path)
    (ckpt / "config.json").write_bytes(text.encode("latin-1"))
    expect_error(ckpt, ckpt / "config.json")


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"hidden_size": -32}, "hidden_size"),
        ({"num_attention_heads": 3}, "num_attention_heads"),
        ({"sink_position": "middle"}, "sink_position"),
        ({"num_sink_tokens": -1}, "num_sink_tokens"),
        ({"mask_token_id": 1000}, "mask_token_id"),
        ({"rope_theta": "fast"}, "config"),
        ({"vocab_size": "67"}, "vocab_size"),
        ({"model_type": "gpt2"}, "not supported"),
    ],
)
def test_error_invalid_config_values(tmp_path, changes, field):
    _, ckpt = saved(tmp_path)
    edit_config(ckpt, **changes)
    assert field in expect_error(ckpt, ckpt / "config.json")


def test_error_missing_weights(tmp_path):
    _, ckpt = saved(tmp_path)
    (ckpt / "model.safetensors").unlink()
    expect_error(ckpt, ckpt / "model.safetensors")


def test_error_pickle_is_never_read(tmp_path):
    model, ckpt = saved(tmp_path)
    (ckpt / "model.safetensors").unlink()
    torch.save(model.state_dict(), ckpt / "pytorch_model.bin")
    assert "pickle files are never read" in expect_error(ckpt, ckpt / "model.safetensors")


@pytest.mark.parametrize("keep", [0.5, 0.99, 8, 3])
def test_error_truncated_weights(tmp_path, keep):
    _, ckpt = saved(tmp_path)
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep) if keep < 1 else keep])
    assert "corrupt or truncated" in expect_error(ckpt, path)


# Named ids, seeded bytes: a test id must be the same in every process (pytest -n 2 collects per worker).
@pytest.mark.parametrize(
    "garbage",
    [b"\x00" * 4096, random.Random(0).randbytes(4096), b"PK\x03\x04 a zip, not safetensors"],
    ids=["zeros", "random-bytes", "zip-header"],
)
def test_error_corrupt_weights(tmp_path, garbage):
    _, ckpt = saved(tmp_path)
    (ckpt / "model.safetensors").write_bytes(garbage)
    expect_error(ckpt, ckpt / "model.safetensors")


def test_error_corrupt_header_json(tmp_path):
    _, ckpt = saved(tmp_path)
    path = ckpt / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:9] = b"["  # the header's opening "{" -> invalid JSON header
    path.write_bytes(bytes(data))
    expect_error(ckpt, path)


def test_error_config_weights_mismatch_shape(tmp_path):
    _, ckpt = saved(tmp_path)
    edit_config(ckpt, hidden_size=16, intermediate_size=48)
    msg = expect_error(ckpt, ckpt / "model.safetensors")
    assert str(ckpt / "config.json") in msg and "shape mismatch" in msg


def test_error_config_weights_mismatch_missing_tensor(tmp_path):
    _, ckpt = saved(tmp_path)
    path = ckpt / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(path))
    assert "missing ['layers.1.mlp.up_proj.weight']" in expect_error(ckpt, path)


@pytest.mark.parametrize(
    "changes,word",
    [
        ({"num_sink_tokens": 1}, "missing ['sink_embeddings']"),
        ({"gated_attention": True}, "g_proj"),
        ({"num_hidden_layers": 3}, "layers.2"),
        ({"num_hidden_layers": 1}, "unexpected"),
        ({"tie_word_embeddings": False}, "lm_head.weight"),
    ],
)
def test_error_config_weights_mismatch_switches(tmp_path, changes, word):
    _, ckpt = saved(tmp_path)
    edit_config(ckpt, **changes)
    assert word in expect_error(ckpt, ckpt / "model.safetensors")


def test_error_sharded_index_with_missing_shard(tmp_path):
    model, ckpt = saved(tmp_path)
    tensors = load_file(str(ckpt / "model.safetensors"))
    names = sorted(tensors)
    half = len(names) // 2
    save_file({k: tensors[k] for k in names[:half]}, str(ckpt / "model-00001-of-00002.safetensors"))
    weight_map = {k: "model-00001-of-00002.safetensors" for k in names[:half]}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in names[half:]})
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (ckpt / "model.safetensors").unlink()
    expect_error(ckpt, ckpt / "model-00002-of-00002.safetensors")
    # ... and with the second shard present, the sharded checkpoint loads the same model.
    save_file({k: tensors[k] for k in names[half:]}, str(ckpt / "model-00002-of-00002.safetensors"))
    torch.testing.assert_close(logits(DiffusionLM.from_pretrained(ckpt)), logits(model), atol=0, rtol=0)


# ----------------------------------------------------------------------------- atomic saves
def test_save_leaves_no_temp_files_and_readable_modes(tmp_path):
    model, ckpt = saved(tmp_path, num_sink_tokens=1)
    model.save_pretrained(ckpt)  # overwrite in place
    assert sorted(p.name for p in ckpt.iterdir()) == ["config.json", "model.safetensors"]
    umask = os.umask(0)
    os.umask(umask)
    for p in ckpt.iterdir():  # same mode as a plain open(): not mkstemp's private 0600
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~umask, p


class Crash(RuntimeError):
    pass


def test_crash_during_weights_write_keeps_previous_checkpoint(tmp_path, monkeypatch):
    old, ckpt = saved(tmp_path, num_sink_tokens=1)
    old_logits = logits(old)
    new = make(seed=1, num_sink_tokens=2, hidden_size=64)  # a different model, different config
    real_save = safetensors.torch.save_file

    def half_then_crash(tensors, filename, metadata=None):
        real_save(tensors, filename, metadata=metadata)
        data = open(filename, "rb").read()
        with open(filename, "wb") as f:
            f.write(data[: len(data) // 2])
        raise Crash("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", half_then_crash)
    with pytest.raises(Crash):
        new.save_pretrained(ckpt)
    monkeypatch.undo()
    assert sorted(p.name for p in ckpt.iterdir()) == ["config.json", "model.safetensors"]
    loaded = DiffusionLM.from_pretrained(ckpt)
    assert loaded.config == old.config
    torch.testing.assert_close(logits(loaded), old_logits, atol=0, rtol=0)


def test_crash_during_config_write_keeps_previous_config(tmp_path, monkeypatch):
    """config.json is written last and atomically: a crash there leaves the old file intact."""
    import sinkdlm.io.atomic as ck

    old, ckpt = saved(tmp_path)
    old_config = (ckpt / "config.json").read_text()

    def crash(*a, **k):
        raise Crash("killed")

    monkeypatch.setattr(ck.os, "replace", lambda *a: crash() if str(a[1]).endswith("config.json") else os.rename(*a))
    with pytest.raises(Crash):
        make(seed=3).save_pretrained(ckpt)
    monkeypatch.undo()
    assert (ckpt / "config.json").read_text() == old_config
    assert sorted(p.name for p in ckpt.iterdir()) == ["config.json", "model.safetensors"]
    DiffusionLM.from_pretrained(ckpt)  # same architecture: still a consistent pair
