"""The files the command-line fuzz test (test_cli_fuzz.py) feeds the commands: tiny valid models,
broken model directories and bad input files, built once per session under one directory.

Every path has a short name (`ok`, `truncated`, `latin1.txt`, ...): the seed corpus writes
`{ok}` in an argv and the test substitutes the path, so corpus cases stay valid across machines.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

TEXTS = [
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n",
    "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of troubles\n",
    "And by opposing end them. To die, to sleep,\nNo more; and by a sleep to say we end\n",
]


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _tiny_config(tok, **kw):
    from sinkdlm import ModelConfig

    cfg = dict(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
               intermediate_size=32, max_position_embeddings=256, mask_token_id=tok.mask_token_id)
    return ModelConfig(**{**cfg, **kw})


def build(root: Path) -> dict[str, str]:
    """Build the world under `root`; {short name: path}."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from sinkdlm import DiffusionLM
    from sinkdlm.data import train_bpe_tokenizer

    root.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    tok = train_bpe_tokenizer(TEXTS * 4, 300)

    def model_dir(name: str, **kw) -> Path:
        torch.manual_seed(0)
        DiffusionLM(_tiny_config(tok, **kw)).save_pretrained(root / name, tokenizer=tok)
        paths[name] = root / name
        return root / name

    # ---- models that load
    model_dir("ok")
    model_dir("ok_sink", num_sink_tokens=1)
    chat_tok = train_bpe_tokenizer(TEXTS * 4, 300)  # `sinkdlm chat`: ChatML's turn tokens and template
    chat_tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    chat_tok.chat_template = CHATML
    torch.manual_seed(0)
    DiffusionLM(_tiny_config(chat_tok)).save_pretrained(root / "chat_ok", tokenizer=chat_tok)
    paths["chat_ok"] = root / "chat_ok"
    hf = root / "hf_qwen2"  # an autoregressive HF directory: `convert --from-hf`, AR `analyze`
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                 tie_word_embeddings=True)).save_pretrained(str(hf))
    tok.save_pretrained(str(hf))
    paths["hf_qwen2"] = hf

    # ---- model directories that must be refused with one line
    def broken(name: str, edit) -> None:
        shutil.copytree(root / "ok", root / name)
        edit(root / name)
        paths[name] = root / name

    broken("no_config", lambda d: (d / "config.json").unlink())
    broken("corrupt_config", lambda d: (d / "config.json").write_text('{"vocab_size": 3'))
    broken("config_not_object", lambda d: (d / "config.json").write_text("[1, 2]"))
    broken("truncated_weights", lambda d: (d / "model.safetensors").write_bytes(
        (d / "model.safetensors").read_bytes()[:500]))
    broken("pickle_only", lambda d: (torch.save({"x": torch.zeros(1)}, d / "pytorch_model.bin"),
                                      (d / "model.safetensors").unlink()))
    broken("other_format", lambda d: (d / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": 30})))
    broken("no_tokenizer", lambda d: [p.unlink() for p in d.iterdir() if p.name.startswith(("tokenizer", "special"))])
    other = model_dir("_other_shape", hidden_size=32, intermediate_size=64)
    broken("other_shape_weights", lambda d: shutil.copy(other / "model.safetensors", d / "model.safetensors"))
    small = train_bpe_tokenizer(TEXTS, 280)
    broken("vocab_mismatch", lambda d: small.save_pretrained(str(d)))
    (root / "empty_dir").mkdir()
    paths["empty_dir"] = root / "empty_dir"

    # ---- input files
    files = {
        "prompts.txt": "\n".join(TEXTS).encode(),
        "prompts.jsonl": "".join(json.dumps({"prompt": t}) + "\n" for t in TEXTS).encode(),
        "sft.jsonl": "".join(json.dumps({"prompt": t[:20], "response": t[20:40]}) + "\n" for t in TEXTS * 3).encode(),
        "corpus.txt": ("\n\n".join(TEXTS * 20)).encode(),
        "config.yaml": b"max_steps: 1\nbatch_size: 2\nseq_len: 16\n",
        "empty.txt": b"",
        "binary.bin": bytes(range(256)) * 16,
        "latin1.txt": "caf\xe9 au lait\n".encode("latin-1"),
        "latin1.jsonl": '{"prompt": "caf\xe9"}\n'.encode("latin-1"),
        "malformed.json": b'{"max_steps": ',
        "malformed.jsonl": b'{"prompt": "a"}\n{"prompt": \n',
        "nofield.jsonl": b'{"question": "a"}\n',
        "list.json": b"[1, 2, 3]\n",
        "big_line.txt": b"x" * (10 * 1024 * 1024),  # one 10 MB line
        "garbage.gguf": b"GGUF" + bytes(range(256)) * 4,  # a .gguf name, a broken header
        "empty.gguf": b"",
    }
    for name, body in files.items():
        (root / name).write_bytes(body)
        paths[name] = root / name
    (root / "a_dir").mkdir()
    paths["a_dir"] = root / "a_dir"
    paths["missing"] = root / "does_not_exist"
    return {k: str(v) for k, v in paths.items() if not k.startswith("_")}
