"""`sinkdlm generate` and `generate_text`: flags that do not apply to the model's kind, every check before a
weight is read, chat templates, stopping at the end of the text, and the note on a blank output."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch

from sinkdlm import DiffusionLM, ModelConfig
from sinkdlm.cli.app import main

SHAPE = dict(vocab_size=47, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=64, max_position_embeddings=64)
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# ChatML, as SmolLM2's GGUF carries it (tokenizer.chat_template), without the default system turn
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>'"
          " + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def chat_tokenizer():
    """A word-level tokenizer with ChatML's turn tokens and a chat template: [UNK]=0, [PAD]=1, w0..w39,
    user=42, assistant=43, <|im_start|>=44, <|im_end|>=45 (also EOS), [MASK]=46."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[PAD]": 1, **{f"w{i}": i + 2 for i in range(40)}, "user": 42, "assistant": 43,
             IM_START: 44, IM_END: 45, "[MASK]": 46}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", mask_token="[MASK]",
                                  eos_token=IM_END, additional_special_tokens=[IM_START])
    tok.chat_template = CHATML
    return tok


def save_model(path, *, causal: bool, seed: int = 0):
    cfg = ModelConfig(**SHAPE, causal=True, shift_logits=True, mask_token_id=None) if causal else \
        ModelConfig(**SHAPE, mask_token_id=46)
    torch.manual_seed(seed)
    DiffusionLM(cfg).save_pretrained(path, tokenizer=chat_tokenizer())
    return path


@pytest.fixture
def no_weights(monkeypatch):
    """Fail the test if any weight is read: every check must come before."""
    import sinkdlm.model.loader as loader

    def refuse(*a, **k):
        raise AssertionError("weights were read before the arguments were checked")

    monkeypatch.setattr(loader, "read_tensors", refuse)


def run(args, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


# ----------------------------------------------------------------------------- one rule for diffusion-only flags
@pytest.mark.parametrize("flags, named", [
    (["--cache", "prefix"], ["--cache=prefix"]),
    (["--threshold", "0.9"], ["--threshold=0.9"]),
    (["--remasking", "entropy", "--schedule", "dream"], ["--remasking=entropy", "--schedule=dream"]),
    (["--alg-temp", "0.5"], ["--alg-temp=0.5"]),
    (["--block-length", "2", "--steps", "2"], ["--steps=2", "--block-length=2"]),
    (["--compile", "--eps", "0.01"], ["--compile", "--eps=0.01"]),
])
def test_autoregressive_model_refuses_exactly_the_diffusion_flags_given(tmp_path, capsys, no_weights, flags, named):
    model = save_model(tmp_path / "ar", causal=True)
    code, out, err = run(["generate", "--model", str(model), "--prompt", "w1", "--gen-length", "4", *flags], capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: this model is autoregressive"), err
    given = [w for w in lines[0].replace(",", " ").split() if w.startswith("--")]
    assert given == named  # exactly the flags typed, each with its value, none with a bare "="
    assert not any(w.endswith("=") for w in given)


def test_autoregressive_model_accepts_the_settings_it_uses(tmp_path, capsys):
    """Temperature, top-k, seed, and steps = block length = gen length (one token per step: what it does)."""
    model = save_model(tmp_path / "ar", causal=True)
    code, out, err = run(["generate", "--model", str(model), "--prompt", "w1 w2", "--gen-length", "3",
                          "--temperature", "0.5", "--top-k", "5", "--seed", "3", "--steps", "3", "--block-length", "3",
                          "--json"], capsys)
    assert code == 0, err
    assert len(json.loads(out)["tokens"]) == 3


# ----------------------------------------------------------------------------- checks before any weight
@pytest.mark.parametrize("flags, message", [
    (["--gen-length", "8"], "error: --steps is required"),
    (["--gen-length", "24", "--steps", "24", "--block-length", "7"], "error: --gen-length=24 is not divisible by --block-length=7"),
    (["--gen-length", "-5", "--steps", "4"], "error: --gen-length must be an integer >= 1, got -5"),
    (["--gen-length", "8", "--steps", "8", "--cache", "dual"], "error: --cache=dual reuses"),
    (["--gen-length", "8", "--steps", "1", "--block-length", "4"], "error: --steps=1 is fewer than the number of blocks (8/4 = 2)"),
    (["--gen-length", "8", "--steps", "8", "--remasking", "nope"], "error: --remasking must be one of"),
    (["--gen-length", "8", "--threshold", "2"], "error: --threshold must be a probability in [0, 1], got 2.0"),
])
def test_diffusion_settings_are_checked_before_any_weight(tmp_path, capsys, no_weights, flags, message):
    model = save_model(tmp_path / "dlm", causal=False)
    code, out, err = run(["generate", "--model", str(model), "--prompt", "w1", *flags], capsys)
    assert code == 2 and out == ""
    assert err.startswith(message) and len(err.strip().splitlines()) == 1, err  # no note before the error
    assert "None" not in err


def test_chat_without_a_template_is_refused_before_loading(tmp_path, capsys, no_weights):
    from helpers import word_tokenizer

    DiffusionLM(ModelConfig(**SHAPE, mask_token_id=46)).save_pretrained(tmp_path, tokenizer=word_tokenizer())
    code, _, err = run(["generate", "--model", str(tmp_path), "--prompt", "w1", "--gen-length", "4", "--steps", "4",
                        "--chat"], capsys)
    assert code == 2 and err.startswith("error: --chat needs the model's chat template"), err


# ----------------------------------------------------------------------------- chat template and stopping
def test_chat_prompt_is_the_template_and_the_turn_tokens_stop_the_text():
    from sinkdlm.diffusion.text import encode_prompt, stop_token_ids

    tok = chat_tokenizer()
    ids = encode_prompt(tok, "w3 w4", chat=True)
    # the template rendered by hand: <|im_start|> user \n w3 w4 <|im_end|> \n <|im_start|> assistant \n
    assert ids == [44, 42, 5, 6, 45, 44, 43]
    assert encode_prompt(tok, "w3 w4", chat=False) == [5, 6]
    assert set(stop_token_ids(tok, chat=True)) == {45, 44}  # end of turn (= EOS) and the next turn's start
    assert stop_token_ids(tok, chat=False) == (45,)


def test_saved_and_reloaded_tokenizer_keeps_its_chat_template(tmp_path):
    from sinkdlm.checkpoint.kind import model_kind
    from sinkdlm.checkpoint.manager import load_tokenizer_for

    save_model(tmp_path, causal=False)
    assert load_tokenizer_for(tmp_path).chat_template == CHATML
    kind = model_kind(tmp_path)
    assert kind.chat_template and not kind.autoregressive and kind.family == "llada"


def test_autoregressive_decoding_stops_at_a_stop_token_and_pads_with_it():
    from sinkdlm import generate

    torch.manual_seed(0)
    model = DiffusionLM(ModelConfig(**SHAPE, causal=True, shift_logits=True, mask_token_id=None)).eval()
    prompt = [[3, 4, 5]]
    free = generate(model, prompt, gen_length=8, return_dict=True)
    row = free.sequences[0, 3:].tolist()
    k = 2
    stop = row[k]
    first = row.index(stop)  # the stop id may come earlier than position k
    out = generate(model, prompt, gen_length=8, stop_token_ids=(stop,), return_dict=True)
    got = out.sequences[0, 3:].tolist()
    assert got[:first + 1] == row[:first + 1]  # the same tokens up to and including the stop
    assert got[first + 1:] == [stop] * (8 - first - 1)  # then padding, not more decoding
    assert out.steps_taken == first + 1 and out.sequences.shape == (1, 11)


def test_diffusion_output_is_cut_at_the_end_of_the_turn_and_padded(monkeypatch):
    """A DLM fills every position at once: what comes after <|im_end|> (a new turn, role names) is replaced
    by EOS, as LLaDA pads, and never decoded."""
    import sinkdlm.diffusion.text as text
    from sinkdlm.diffusion.sampling import GenerationOutput

    tok = chat_tokenizer()
    made = [7, 8, 45, 44, 42, 9, 45, 45]  # w5 w6 <|im_end|> <|im_start|> user w7 ...

    def fake_generate(model, ids, settings, callback=None, return_dict=True):
        seq = torch.tensor([ids + made])
        return GenerationOutput(sequences=seq, attention_mask=None, prompt_length=len(ids), steps_taken=8)

    monkeypatch.setattr(text, "generate", fake_generate)
    model = DiffusionLM(ModelConfig(**SHAPE, mask_token_id=46))
    out = text.generate_text(model, tok, "w1", gen_length=8, steps=8, chat=True)
    assert out.text == "w5 w6" and "user" not in out.text
    assert out.tokens == [7, 8] + [45] * 6 and not out.blank
    kept = text.generate_text(model, tok, "w1", gen_length=8, steps=8, stop_at_eos=False)
    assert kept.tokens == made  # --no-stop-at-eos: every generated token


def test_blank_output_gets_a_one_line_note(tmp_path, capsys, monkeypatch):
    import sinkdlm.diffusion.text as text
    from sinkdlm.diffusion.sampling import GenerationOutput

    def only_eos(model, ids, settings, callback=None, return_dict=True):
        seq = torch.tensor([ids + [45] * settings.gen_length])
        return GenerationOutput(sequences=seq, attention_mask=None, prompt_length=len(ids), steps_taken=1)

    monkeypatch.setattr(text, "generate", only_eos)
    model = save_model(tmp_path, causal=False)
    code, out, err = run(["generate", "--model", str(model), "--prompt", "w1", "--gen-length", "4", "--steps", "4",
                          "--json"], capsys)
    assert code == 0 and json.loads(out)["text"] == ""
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "has no letter or digit" in notes[0]


@pytest.mark.parametrize("decoded,blank", [("," + "\n" * 15, True), (" . ! \n", True), ("", True), ("a,", False),
                                           ("7", False), ("é", False)])
def test_blank_means_no_letter_or_digit(decoded, blank, monkeypatch):
    """Issue 53: `,` and 15 blank lines is no text either; the reference is the definition itself."""
    import sinkdlm.diffusion.text as text
    from sinkdlm.diffusion.sampling import GenerationOutput

    monkeypatch.setattr(text, "generate", lambda model, ids, settings, callback=None, return_dict=True: GenerationOutput(
        sequences=torch.tensor([ids + [7, 45, 45, 45]]), attention_mask=None, prompt_length=len(ids), steps_taken=4))
    tok = chat_tokenizer()
    monkeypatch.setattr(tok, "decode", lambda ids, **kw: decoded)
    out = text.generate_text(DiffusionLM(ModelConfig(**SHAPE, mask_token_id=46)), tok, "w1", gen_length=4, steps=4)
    assert out.blank is blank and not out.truncated


@pytest.mark.parametrize("made,truncated", [([7, 8, 9, 10], True), ([7, 8, 45, 45], False)])
def test_text_cut_at_gen_length_gets_a_one_line_note(made, truncated, tmp_path, capsys, monkeypatch):
    import sinkdlm.diffusion.text as text
    from sinkdlm.diffusion.sampling import GenerationOutput

    monkeypatch.setattr(text, "generate", lambda model, ids, settings, callback=None, return_dict=True: GenerationOutput(
        sequences=torch.tensor([ids + made]), attention_mask=None, prompt_length=len(ids), steps_taken=4))
    model = save_model(tmp_path, causal=False)
    code, out, err = run(["generate", "--model", str(model), "--prompt", "w1", "--gen-length", "4", "--steps", "4"],
                         capsys)
    assert code == 0 and out.split() == (["w5", "w6", "w7", "w8"] if truncated else ["w5", "w6"])
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert notes == (["note: the text was cut at --gen-length 4 tokens, before the model ended it; raise --gen-length "
                      "for the whole answer"] if truncated else [])


# ----------------------------------------------------------------------------- the example GGUF
@pytest.mark.real_model
def test_refusal_on_the_example_gguf_takes_under_two_seconds():
    from helpers import example_gguf_or_skip, subprocess_env

    gguf = example_gguf_or_skip()
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "sinkdlm", "generate", "--model", str(gguf), "--prompt", "hi",
                             "--gen-length", "8", "--cache", "prefix"], capture_output=True, text=True,
                            env=subprocess_env(), timeout=60)
    seconds = time.perf_counter() - start
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "error: this model is autoregressive (it decodes one token per step, left to right): --cache=prefix "
        "applies to diffusion decoding only; leave it out"]
    assert seconds < 2.0, f"the refusal took {seconds:.2f} s (a new process, header only)"


@pytest.mark.real_model
def test_example_gguf_header_says_autoregressive_with_a_chat_template():
    from helpers import example_gguf_or_skip

    from sinkdlm.checkpoint.kind import model_kind

    kind = model_kind(example_gguf_or_skip())
    assert kind.autoregressive and kind.chat_template


def test_analyze_refuses_diffusion_flags_on_an_autoregressive_model(tmp_path, capsys, no_weights):
    model = save_model(tmp_path / "ar", causal=True)
    code, _, err = run(["analyze", "--model", str(model), "--prompts", str(model / "config.json"), "--gen-length", "4",
                        "--block-length", "2", "--remasking", "random", "--out", str(tmp_path / "a")], capsys)
    assert code == 2 and err.strip().splitlines() == [
        "error: this model is autoregressive (it decodes one token per step, left to right): --block-length=2 and "
        "--remasking=random apply to diffusion decoding only; leave them out"]
