"""Block-diffusion checkpoints opened directly as block models (`sinkdlm.model.formats`, docs/method.md §10, §13).

Tiny random checkpoints are written here in the layouts of the released models, with their config fields:
  * Fast-dLLM v2: a `Qwen2ForCausalLM` (Qwen2.5 names, QKV bias) saved with `model_type: "Fast_dLLM_Qwen"`,
    `architectures: ["Fast_dLLM_QwenForCausalLM"]` and its block size as `bd_size`; its logits are shifted;
  * SDAR: a `Qwen3ForCausalLM` (Qwen3 names, a per-head RMSNorm of q and k) saved with `model_type: "sdar"`,
    `architectures: ["SDARForCausalLM"]` and `block_size`; its logits are not shifted.
Both are checked against transformers' own Qwen2 / Qwen3 forward on the same weights under an explicit
block-causal mask built here (query i sees key j when j // b <= i // b, blocks counted from position 0, as
both models' inference masks are). Their own decoders need their remote modeling code (extra forward arguments
of their own), which is never run, so neither is compared token for token with its own code. Instead each
decoding rule is re-implemented here over transformers' model without a cache (every pass over the whole
sequence so far under the block-causal mask), and sinkdlm's block decoding (static cache) gives its tokens, in
float64: SDAR's greedy `low_confidence_static` over Qwen3; Fast-dLLM v2's `batch_sample` rule (read, not run)
over Qwen2, with its shifted read-out (a block's first token from the previous block's last position, committed
at once; the block's other tokens from the column before them), greedy steps and its threshold rule, its
sub-blocks (`small_block_size`, sinkdlm's `block_length`) smaller than the block too, a length that is not a
multiple of the block and an end-of-text stop. Fast-dLLM v2's shifted block NELBO equals, draw for
draw, its terms recomputed over transformers' Qwen2; `sinkdlm train --init-from` fine-tunes it (its shifted loss is
checked in tests/diffusion/test_block.py) and the checkpoint written reopens and decodes.
Each checkpoint carries an `auto_map` to Python files that would leave a marker when imported.
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from sinkdlm import DiffusionLM
from sinkdlm.checkpoint.manager import load_model_and_tokenizer
from sinkdlm.data.tokenizer import train_bpe_tokenizer
from sinkdlm.diffusion.block import block_diffusion_loss, block_draws
from sinkdlm.diffusion.likelihood import loglikelihood
from sinkdlm.diffusion.sampling import StepProbe, generate
from sinkdlm.io.files import CheckpointError

from numerics import assert_model_close

V = 320
B = 4  # the block size written into the tiny checkpoints
TEXTS = ["the quick brown fox jumps over the lazy dog, and the cat sleeps. " * 30,
         "to be or not to be: that is the question; whether tis nobler. " * 30]
EVIL = "import pathlib\npathlib.Path(__file__).with_name('EXECUTED').write_text('x')\nraise SystemExit('ran')\n"
COMMON = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rope_theta=5000.0, rms_norm_eps=1e-5,
              tie_word_embeddings=False, attn_implementation="eager", bos_token_id=0, eos_token_id=0)


@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(TEXTS, 300)  # <|endoftext|> 0, <|pad|> 1, [MASK] 2


def hf_model(layout: str):
    """A tiny transformers model of the layout's architecture, every weight random (norms near 1, QK norms too)."""
    if layout == "fast_dllm_v2":
        model = Qwen2ForCausalLM(Qwen2Config(**COMMON))
    else:  # Qwen3: head_dim given explicitly (its default is 128), the natural hidden / heads
        model = Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=8, attention_bias=False))
    gen = torch.Generator().manual_seed(21 + (layout == "sdar"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = 0.2 * torch.randn(*p.shape, generator=gen)
            p.copy_(1 + noise if "norm" in name else 1.5 * noise)
    return model.eval()


def save_layout(model, path, tok, layout: str, **changes):
    """Save `model` as the released checkpoints are laid out: their model_type, architectures, block-size key."""
    model.save_pretrained(str(path), max_shard_size="40KB")  # sharded, with an index
    cfg = json.loads((path / "config.json").read_text())
    if layout == "fast_dllm_v2":
        cfg.update(model_type="Fast_dLLM_Qwen", architectures=["Fast_dLLM_QwenForCausalLM"], bd_size=B)
    else:
        cfg.update(model_type="sdar", architectures=["SDARForCausalLM"], block_size=B)
    cfg.update(mask_token_id=tok.mask_token_id, auto_map={"AutoModelForCausalLM": "modeling_evil.EvilModel"})
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (path / "config.json").write_text(json.dumps(cfg))
    for name in ("modeling_evil.py", "configuration_evil.py"):
        (path / name).write_text(EVIL)
    tok.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module", params=["fast_dllm_v2", "sdar"])
def layout(request, tmp_path_factory, tok):
    hf = hf_model(request.param)
    return request.param, hf, save_layout(hf, tmp_path_factory.mktemp(request.param), tok, request.param)


def ids(b=2, n=11, seed=1):
    return torch.randint(3, 290, (b, n), generator=torch.Generator().manual_seed(seed))


def block_causal_additive(n: int, block: int) -> torch.Tensor:
    """`[1, 1, n, n]` float mask, 0 where query i may see key j (j's block not after i's), -inf elsewhere."""
    blocks = torch.arange(n) // block
    allowed = blocks[:, None] >= blocks[None, :]
    return torch.zeros(n, n).masked_fill(~allowed, float("-inf"))[None, None]


def test_block_layouts_open_as_block_models_with_transformers_logits(layout, tok):
    name, hf, path = layout
    assert len(list(path.glob("model-*.safetensors"))) > 1
    model, tokenizer = load_model_and_tokenizer(path, device="cpu")
    cfg = model.config
    assert cfg.block_size == B and not cfg.causal and cfg.extra["source_format"] == name
    assert cfg.mask_token_id == tokenizer.mask_token_id == tok.mask_token_id
    assert (cfg.shift_logits, cfg.qkv_bias, cfg.qk_norm) == ((True, True, False) if name == "fast_dllm_v2"
                                                             else (False, False, True))
    x = ids()
    with torch.no_grad():  # transformers' forward under the block-causal mask (rows 2 and 3 of the 11 tokens: 3 blocks)
        ref = hf(input_ids=x, attention_mask=block_causal_additive(x.shape[1], B).expand(2, 1, -1, -1)).logits
        ours = model(x).logits
    assert_model_close(ours, ref, cfg)  # transformers' kernels: rule 2
    # the block structure is the model's: a token changed in the last block leaves the earlier blocks' logits alone
    y = x.clone()
    y[:, -1] = 7
    with torch.no_grad():
        changed = model(y).logits
    assert torch.equal(changed[:, :8], ours[:, :8])  # same kernels, same shapes, the first two blocks never see it
    assert not torch.equal(changed[:, 8:], ours[:, 8:])
    assert not (path / "EXECUTED").exists()


def test_block_layouts_decode_score_and_train(layout, tok):
    name, _, path = layout
    model = DiffusionLM.from_pretrained(path)
    out = generate(model, [5, 6, 7], gen_length=8, steps=8)  # the prompt ends inside the first block
    assert out.shape == (1, 11) and torch.equal(out[0, :3], torch.tensor([5, 6, 7]))
    assert not (out == model.config.mask_token_id).any()  # every generated column is filled
    ll = loglikelihood(model, [5, 6], [7, 8], mc_num=4, seed=0)
    assert torch.isfinite(torch.as_tensor(ll.logprob)).all() and float(ll.logprob) < 0
    loss = block_diffusion_loss(model, ids(n=10), pad_id=0)  # Fast-dLLM v2: its shifted loss (tests/diffusion)
    assert torch.isfinite(loss.loss) and float(loss.loss.detach()) > 0
    if name == "fast_dllm_v2":
        with pytest.raises(ValueError, match="at least one token"):  # the first token is read from the one before
            generate(model, [[]], gen_length=4, steps=4)
        # the analysis's decoding (a probe: the whole canvas a step, each block's first column an unrecorded pass)
        assert torch.equal(generate(model, [5, 6, 7], gen_length=8, steps=8, probe=StepProbe(attentions=True)), out)
        assert torch.equal(generate(model, [5, 6, 7], gen_length=8, steps=8, probe=StepProbe()), out)  # asks nothing


@pytest.mark.parametrize("mode", ["all", "lora", "sink", "sft"])
def test_fast_dllm_v2_fine_tunes_from_the_cli(tmp_path, tok, capsys, mode):
    """`sinkdlm train --init-from` the tiny Fast-dLLM v2 checkpoint (every weight; LoRA adapters merged at the end;
    its sink alone, added by `sinkdlm convert`) and `sinkdlm sft --model` it (prompt/response pairs): a few finite
    steps of its shifted block loss, and the checkpoint written reopens as the same shifted block model, with moved
    weights (only the adapted ones, or the sink), and decodes."""
    from sinkdlm.cli import main
    from sinkdlm.training.checkpointing import latest_checkpoint

    from helpers import read_metrics, write_corpus

    if mode == "lora":
        pytest.importorskip("peft")
    source = save_layout(hf_model("fast_dllm_v2"), tmp_path / "v2", tok, "fast_dllm_v2")
    if mode == "sink":  # a sink to train: added to the checkpoint first, every other weight kept
        with pytest.raises(SystemExit) as exc:
            main(["convert", "--from-hf", str(source), "--out", str(tmp_path / "sinked"), "--num-sink-tokens", "1"])
        assert exc.value.code == 0, capsys.readouterr().err[-3000:]
        source = tmp_path / "sinked"
    pairs = tmp_path / "pairs.jsonl"  # prompts of 2 to 6 words: some end inside a block, some on its boundary
    pairs.write_text("".join(json.dumps({"prompt": " ".join(TEXTS[i % 2].split()[i % 5:i % 5 + 2 + i % 5]),
                                         "response": " ".join(TEXTS[1 - i % 2].split()[i % 7:i % 7 + 6])}) + "\n"
                             for i in range(24)))
    data = ["sft", "--model", str(source), "--data", str(pairs), "--seq-len", "30"] if mode == "sft" else \
        ["train", "--init-from", str(source), "--data", str(write_corpus(tmp_path / "docs.jsonl")),
         "--cache-dir", str(tmp_path / "cache"), "--seq-len", "14"]  # 14, 30: padded to 16, 32 with EOS
    extra = {"lora": ["--trainable", "lora", "--merge"], "sink": ["--trainable", "sink"]}.get(mode, [])
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        main([*data, "--out", str(out), "--max-steps", "3", "--batch-size", "2", "--log-every", "1", "--eval-every",
              "3", "--save-every", "3", "--eval-batches", "1", "--lr", "1e-2", "--device", "cpu", "--no-tensorboard",
              "--seed", "0", *extra])
    assert exc.value.code == 0, capsys.readouterr().err[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3] and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert torch.isfinite(torch.tensor(rows[-1]["val_loss"]))
    trained = DiffusionLM.from_pretrained(out / "merged" if mode == "lora" else latest_checkpoint(out))
    start = DiffusionLM.from_pretrained(source)
    assert (trained.config.block_size, trained.config.shift_logits) == (B, True)
    moved = [k for k, v in start.state_dict().items() if not torch.equal(v, trained.state_dict()[k])]
    assert moved and (mode != "lora" or all("proj" in k for k in moved))
    assert mode != "sink" or moved == ["sink_embeddings"]
    decoded = generate(trained, [5, 6, 7], gen_length=8, steps=8)
    assert decoded.shape == (1, 11) and not (decoded == trained.config.mask_token_id).any()


def sdar_rule_reference(hf, prompt: list[int], gen: int, steps: int, mask_id: int) -> list[int]:
    """SDAR's decoding rule, written here from its description (`low_confidence_static`, greedy: each step reveals
    the block's masked position whose argmax token is most probable) over transformers' model, every pass over
    the whole sequence so far under the block-causal mask (what its cache of finished blocks computes): blocks
    counted from position 0, the prompt's last partial block completed first, `steps` steps a block."""
    total = -(-(len(prompt) + gen) // B) * B
    x = torch.tensor(prompt + [mask_id] * (total - len(prompt)))
    for lo in range(len(prompt) // B * B, total, B):
        hi = lo + B
        quota = [B // steps + (i < B % steps) for i in range(steps)]  # an even split, the remainder first
        for k in quota:
            masked = x[lo:hi] == mask_id
            if not masked.any():
                break
            with torch.no_grad():
                logits = hf(input_ids=x[None, :hi], attention_mask=block_causal_additive(hi, B).double()).logits[0, lo:hi]
            conf, tok = torch.softmax(logits, -1).max(-1)
            order = torch.where(masked, conf, -torch.inf).argsort(descending=True)[:min(k, int(masked.sum()))]
            x[lo + order] = tok[order]
    return x[: len(prompt) + gen].tolist()


def test_sdar_decoding_matches_its_rule_token_for_token(tmp_path, tok):
    """Float64 on both sides (no argmax near-tie can flip): sinkdlm's block decoding (static cache, one pass over
    the block a step) gives the tokens of SDAR's rule re-implemented over transformers' Qwen3 without a cache."""
    hf = hf_model("sdar").double()
    path = save_layout(hf, tmp_path, tok, "sdar")
    model = DiffusionLM.from_pretrained(path, dtype=torch.float64)
    for prompt, gen in (([5, 6, 7, 8, 9, 10], 10), ([11, 12, 13, 14], 8), ([3], 7)):
        blocks = -(-(len(prompt) % B + gen) // B)  # the blocks the answer spans (the prompt's last partial one too)
        ours = generate(model, prompt, gen_length=gen, steps=B * blocks)[0].tolist()
        assert ours == sdar_rule_reference(hf, prompt, gen, B, tok.mask_token_id), (prompt, gen)


def fast_dllm_v2_rule_reference(hf, prompts: list[list[int]], gen: int, mask_id: int, *, steps: int | None = None,
                                threshold: float | None = None, stop: int | None = None,
                                small_block_size: int = B) -> list[list[int]]:
    """Fast-dLLM v2's decoding rule, written here from its `batch_sample` (read, not run), over transformers'
    Qwen2 without a cache: every pass runs the whole sequence so far under the block-causal mask (blocks counted
    from position 0, what its block cache computes). Shifted logits: column c is read from column c - 1. A block
    whose first column is generated gets it at once, the argmax at the previous block's last position (the
    prompt's last token when the prompt ends on a block boundary); the block's other columns are then denoised
    with the block's own pass read shifted, in sub-blocks of `small_block_size` columns (default: one, the block)
    left to right: while the current sub-block has masked columns, a pass over the whole block (recomputed each
    step; the block's keys/values are cached only once it is finished) commits among the sub-block's masked
    columns the most probable one (`steps`: at most steps / sub-blocks steps a sub-block), or every one above
    `threshold` plus the most probable one (its rule). The answer stops at `gen` tokens (its columns past the
    bound do not exist: sinkdlm's bound; Fast-dLLM v2 decodes whole blocks and cuts after) or after the block
    where `stop` appears, the rest `stop`."""
    results = []
    for prompt in prompts:
        n = len(prompt)
        end = n + gen
        x = torch.tensor(prompt + [mask_id] * gen)

        def shifted_logits(hi):  # [hi, V]: row c holds the logits that predict column c (c >= 1)
            with torch.no_grad():
                out = hf(input_ids=x[None, :hi], attention_mask=block_causal_additive(hi, B).double()).logits[0]
            out[:, mask_id] = -torch.inf  # [MASK] is never a prediction
            return torch.cat([out[:1], out[:-1]])

        for lo in range(n // B * B, end, B):
            hi = min(lo + B, end)
            if lo >= n:  # the block's first column: from the previous block's last position, committed at once
                x[lo] = shifted_logits(lo + 1)[lo].argmax()
            for slo in range(lo, hi, small_block_size):  # the sub-blocks, left to right (the last one cut at `end`)
                shi = min(slo + small_block_size, hi)
                for _ in range(steps * small_block_size // B) if steps is not None else iter(int, 1):
                    masked = x[slo:shi] == mask_id
                    if not masked.any():
                        break
                    conf, pred = torch.softmax(shifted_logits(hi)[slo:shi], -1).max(-1)  # the whole block's pass
                    conf = torch.where(masked, conf, -torch.inf)
                    pick = torch.zeros_like(masked)
                    pick[conf.argmax()] = True
                    if threshold is not None:
                        pick |= conf > threshold
                    x[slo:shi] = torch.where(pick & masked, pred, x[slo:shi])
            if stop is not None and (x[n:hi] == stop).any():
                first = n + int((x[n:hi] == stop).nonzero()[0])
                x[first:] = stop
                break
        results.append(x.tolist())
    return results


def test_fast_dllm_v2_decoding_matches_its_rule_token_for_token(tmp_path, tok):
    """Float64 on both sides (no argmax near-tie can flip): sinkdlm's block decoding of the shifted model (static
    cache, one pass over the block a step, the next block's first token from each block's final pass) gives the
    tokens of Fast-dLLM v2's rule re-implemented over transformers' Qwen2 without a cache: prompts that end inside
    a block and on its boundary, a length that is not a multiple of the block, a batch of unequal prompts (left
    padded), greedy steps and the threshold rule, and an end-of-text stop."""
    hf = hf_model("fast_dllm_v2").double()
    path = save_layout(hf, tmp_path, tok, "fast_dllm_v2")
    model = DiffusionLM.from_pretrained(path, dtype=torch.float64)
    mask_id = tok.mask_token_id
    cases = [([5, 6, 7, 8, 9, 10], 10), ([11, 12, 13, 14], 8), ([3], 7), ([20, 21, 22, 23, 24, 25, 26, 27], 9)]
    for prompt, gen in cases:  # greedy, one token a step (B steps a block: the schedule never runs out)
        blocks = -(-(len(prompt) % B + gen) // B)
        ours = generate(model, prompt, gen_length=gen, steps=B * blocks)[0].tolist()
        assert ours == fast_dllm_v2_rule_reference(hf, [prompt], gen, mask_id, steps=B)[0], (prompt, gen)
    batch = [prompt for prompt, _ in cases]
    for threshold in (0.9, 0.3):  # the threshold rule (0.3: several columns a step in this random model)
        ours = generate(model, batch, gen_length=9, threshold=threshold).tolist()
        ref = fast_dllm_v2_rule_reference(hf, batch, 9, mask_id, threshold=threshold)
        assert [row[len(row) - 9:] for row in ours] == [row[len(row) - 9:] for row in ref], threshold
    # an end-of-text stop: a token the greedy answer produces, given as the stop id, ends each row after its block
    prompt, gen = cases[0]
    free = fast_dllm_v2_rule_reference(hf, [prompt], gen, mask_id, steps=B)[0]
    assert len(set(free[len(prompt):len(prompt) + 3])) == 3  # each of the first three is its own first occurrence
    for stop in {free[len(prompt) + 1], free[len(prompt) + 2], free[len(prompt) + 4], free[-1]}:
        out = generate(model, prompt, gen_length=gen, steps=B * 3, stop_token_ids=[stop], return_dict=True)
        assert out.sequences[0].tolist() == fast_dllm_v2_rule_reference(hf, [prompt], gen, mask_id, steps=B,
                                                                          stop=stop)[0], stop
        if stop == free[len(prompt) + 2]:  # read as block 2's first token (column 8): the row ends before block 2's
            assert out.steps_taken == 1 + 2 + 1  # steps (the prefill, block 1's two steps, its final pass)


def test_fast_dllm_v2_sub_blocks_match_its_rule_token_for_token(tmp_path, tok):
    """Fast-dLLM v2's sub-blocks (its `small_block_size`; sinkdlm's `block_length` on a block model) smaller than
    the block, in float64 as above: sinkdlm's cached decoding gives the tokens of the rule re-implemented over
    transformers' Qwen2 without a cache, greedy steps (one token a step) and the threshold rule (0.9, and 0.3: several
    columns a step), a batch of unequal prompts, prompts ending inside a block and on its boundary, EOS stops."""
    hf = hf_model("fast_dllm_v2").double()
    path = save_layout(hf, tmp_path, tok, "fast_dllm_v2")
    model = DiffusionLM.from_pretrained(path, dtype=torch.float64)
    mask_id = tok.mask_token_id
    cases = [([5, 6, 7, 8, 9, 10], 10), ([11, 12, 13, 14], 8), ([3], 7), ([20, 21, 22, 23, 24, 25, 26, 27], 9)]
    differs = False
    for small in (1, 2):
        for prompt, gen in cases:
            blocks = -(-(len(prompt) % B + gen) // B)
            ours = generate(model, prompt, gen_length=gen, steps=B * blocks, block_length=small)[0].tolist()
            ref = fast_dllm_v2_rule_reference(hf, [prompt], gen, mask_id, steps=B, small_block_size=small)[0]
            assert ours == ref, (small, prompt, gen)
            differs |= ref != fast_dllm_v2_rule_reference(hf, [prompt], gen, mask_id, steps=B)[0]
        batch = [prompt for prompt, _ in cases]
        for threshold in (0.9, 0.3):
            ours = generate(model, batch, gen_length=9, threshold=threshold, block_length=small).tolist()
            ref = fast_dllm_v2_rule_reference(hf, batch, 9, mask_id, threshold=threshold, small_block_size=small)
            assert [row[len(row) - 9:] for row in ours] == [row[len(row) - 9:] for row in ref], (small, threshold)
    assert differs  # the sub-blocks change this model's answers: the comparison is not the whole block's again
    prompt, gen = cases[0]
    free = fast_dllm_v2_rule_reference(hf, [prompt], gen, mask_id, steps=B, small_block_size=2)[0]
    for stop in {free[len(prompt) + 1], free[len(prompt) + 4], free[-1]}:
        out = generate(model, prompt, gen_length=gen, steps=B * 3, block_length=2, stop_token_ids=[stop])
        assert out[0].tolist() == fast_dllm_v2_rule_reference(hf, [prompt], gen, mask_id, steps=B, stop=stop,
                                                              small_block_size=2)[0], stop


def test_fast_dllm_v2_block_nelbo_is_its_terms_over_transformers(tmp_path, tok):
    """The shifted block NELBO, draw for draw in float64, recomputed here over transformers' Qwen2 without the
    x_t ⊕ x_0 pass: a block's first continuation token exactly, -log p at the clean previous block's last position
    (the decoding commits it at once from there); every other masked token in a forward over the clean blocks
    before its block and its noised block (block-causal), read at the position before it, weighted M / l."""
    hf = hf_model("fast_dllm_v2").double()
    path = save_layout(hf, tmp_path, tok, "fast_dllm_v2")
    model = DiffusionLM.from_pretrained(path, dtype=torch.float64)
    mask_id, samples = tok.mask_token_id, 6

    def log_probs(x):  # [len(x), V] transformers' forward under the block-causal mask
        with torch.no_grad():
            logits = hf(input_ids=x[None], attention_mask=block_causal_additive(len(x), B).double()).logits[0]
        return torch.log_softmax(logits, -1)

    # the continuation starts inside a block; on a block boundary (the last block then holds only its first column)
    for pre, cont in (([5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15]), ([5, 6, 7, 8], [9, 10, 11, 12, 13])):
        seq = torch.tensor(pre + cont)
        ll = loglikelihood(model, pre, cont, mc_num=samples, seed=0)
        masked, weight = block_draws(seq, len(pre), B, samples, torch.Generator().manual_seed(0), shift=True)
        assert not masked[:, ::B].any() and masked.any()  # a block's first column is never masked
        clean = log_probs(seq)
        exact = -sum(float(clean[c - 1, seq[c]]) for c in range(len(pre), len(seq)) if c % B == 0)
        values = []
        for s in range(samples):
            total = exact
            for lo in range(0, len(seq), B):
                cols = lo + masked[s, lo:lo + B].nonzero()[:, 0]
                if len(cols):
                    x = seq[:lo + B].clone()
                    x[cols] = mask_id
                    noisy = log_probs(x)
                    total -= sum(float(weight[s, c] * noisy[c - 1, seq[c]]) for c in cols.tolist())
            values.append(total)
        values = torch.tensor(values, dtype=torch.float64)  # transformers' rotary angles are float32: 1e-6 relative
        assert float(ll.logprob) == pytest.approx(-float(values.mean()), rel=1e-6, abs=0), (pre, cont)
        assert float(ll.stderr) == pytest.approx(float(values.std() / samples**0.5), rel=1e-5, abs=0)


@pytest.mark.parametrize("name,key,released", [("fast_dllm_v2", "bd_size", 32), ("sdar", "block_size", 4)])
@pytest.mark.parametrize("value", [None, 0, "32"])
def test_a_block_layout_without_its_block_size_is_refused_before_any_weight(tmp_path, tok, name, key, released, value):
    path = save_layout(hf_model(name), tmp_path, tok, name, **{key: value})
    for weights in path.glob("*.safetensors*"):
        weights.unlink()  # the refusal comes from config.json alone: no weight file is needed to get it
    with pytest.raises(CheckpointError, match=f"block size.*{key}.*{released}") as err:
        DiffusionLM.from_pretrained(path)
    assert "\n" not in str(err.value)


def test_block_layouts_refuse_what_they_cannot_compute(tmp_path, tok):
    # a decoupled head_dim (SDAR-4B's 128 over hidden 2560 / 32 heads) is not computed by the sinkdlm model
    path = save_layout(hf_model("sdar"), tmp_path / "hd", tok, "sdar", head_dim=16)
    with pytest.raises(CheckpointError, match="head_dim=16"):
        DiffusionLM.from_pretrained(path)
    # a mask id outside the vocabulary (the released one, 151669, in this 320-token model) is refused by name
    path = save_layout(hf_model("sdar"), tmp_path / "mask", tok, "sdar", mask_token_id=None)
    with pytest.raises(CheckpointError, match="mask_token_id.*151669"):
        DiffusionLM.from_pretrained(path)
    # SDAR's mixture-of-experts variant is another model type, not mapped
    path = save_layout(hf_model("sdar"), tmp_path / "moe", tok, "sdar", model_type="sdar_moe")
    with pytest.raises(CheckpointError, match="sdar_moe.*not supported"):
        DiffusionLM.from_pretrained(path)


def test_qk_norm_round_trips_through_a_sinkdlm_checkpoint(layout, tmp_path):
    name, _, path = layout
    model = DiffusionLM.from_pretrained(path)
    model.save_pretrained(tmp_path / "saved")
    again = DiffusionLM.from_pretrained(tmp_path / "saved")
    assert again.config.block_size == B and again.config.qk_norm == model.config.qk_norm
    x = ids()
    with torch.no_grad():
        assert torch.equal(again(x).logits, model(x).logits)  # a save/load round trip: the same weights and kernels
