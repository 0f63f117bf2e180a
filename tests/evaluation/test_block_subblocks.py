"""Evaluation's `block_length` on a block model (docs/method.md §13) is `generate`'s: its sub-blocks when shorter
than the block, the whole block when as long or longer, the answer's length never padded to it. Reference: the
sampler called directly with the settings written here and the per-request generators the predictor seeds."""

from __future__ import annotations

import types

import pytest
import torch

from sinkdlm.config.commands import LMEvalConfig, ScoringOptions
from sinkdlm.diffusion.sampling import generate
from sinkdlm.evaluation.predictor import DLMPredictor, GenRequest, request_seed

from helpers import tiny_model, word_tokenizer

SEED = 5
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]]  # one prompt ends inside a block, one on its boundary


def _setup():
    model = tiny_model(block_size=4, num_sink_tokens=1, mask_token_id=46)
    return model, DLMPredictor(model, word_tokenizer(), ScoringOptions(progress=False, seed=SEED))


def _direct(model, gen_length: int, steps: int, **kw) -> list[list[int]]:
    """The sampler called directly: every row its own generator, seeded as the predictor seeds a request."""
    gens = [torch.Generator().manual_seed(request_seed(SEED, p)) for p in PROMPTS]
    out = generate(model, PROMPTS, gen_length=gen_length, steps=steps, temperature=0.8, generator=gens, **kw)
    return [row[len(out[0]) - gen_length:] for row in out.tolist()]


@pytest.mark.parametrize("gen_length,sub,steps", [
    (7, 2, 7),  # one token a step: 2 blocks, 4 steps each, 2 sub-blocks
    (5, 1, 7),  # 5 steps would give each of the 2 blocks 3 steps for 4 sub-blocks: raised to 3 * 2 + 1
])
def test_a_shorter_block_length_is_the_sub_blocks(gen_length, sub, steps):
    model, pred = _setup()
    got = pred.generate_ids(PROMPTS, gen_length, block_length=sub, temperature=0.8)
    assert got == _direct(model, gen_length, steps, block_length=sub)


@pytest.mark.parametrize("block_length", [None, 4, 32])
def test_a_block_length_of_the_block_or_more_is_the_whole_block_unpadded(block_length):
    """9 tokens, not rounded up to blocks of `block_length` (the whole-sequence rule), one step each."""
    model, pred = _setup()
    got = pred.generate_ids(PROMPTS, 9, block_length=block_length, temperature=0.8)
    assert got == _direct(model, 9, 9)


def test_a_block_length_that_does_not_divide_the_block_is_refused(tmp_path, monkeypatch):
    model, pred = _setup()
    refusal = (r"block_length=3 does not divide the model's block_size=4 .*"
               r"give a divisor of 4, or 4 \(one sub-block, the whole block\)")
    with pytest.raises(ValueError, match=refusal):
        pred.generate_ids(PROMPTS, 8, block_length=3)
    with pytest.raises(ValueError, match=refusal):
        pred.generate([GenRequest("w1 w2", max_tokens=4, block_length=3)])

    pytest.importorskip("lm_eval")
    import sinkdlm.checkpoint.manager as manager
    from sinkdlm.evaluation.lm_eval_model import SinkDLMEvalModel

    ckpt = tmp_path / "block"
    model.save_pretrained(ckpt, tokenizer=word_tokenizer())

    def no_weights(*args, **kwargs):
        raise AssertionError("weights read before block_length was checked")

    with monkeypatch.context() as m:
        m.setattr(manager, "load_checkpoint", no_weights)
        with pytest.raises(ValueError, match=refusal):
            SinkDLMEvalModel.create_from_arg_obj(dict(pretrained=str(ckpt), block_length=3))
    # a divisor is taken, and generate_until decodes in its sub-blocks
    lm = SinkDLMEvalModel(LMEvalConfig(model=ckpt, block_length=2, progress=False, seed=SEED))
    request = types.SimpleNamespace(args=("w3 w4 w5", dict(max_gen_toks=7, until=[])))
    [text] = lm.generate_until([request], disable_tqdm=True)
    ids = lm.predictor.encode("w3 w4 w5")
    ref = generate(lm.model, [ids], gen_length=7, steps=7, block_length=2)[0, len(ids):].tolist()  # greedy
    assert text == lm.predictor.decode(ref)


def test_a_block_models_kv_cache_dtype_reaches_its_block_cache_and_not_the_greedy_check(monkeypatch):
    """kv_cache_dtype=int8 needs no cache= on a block model (its exact cache is always on) and decodes as the
    sampler does with its int8 block cache; the greedy check, exact decoding, keeps the cache in the model's dtype.
    (On this tiny model int8 and float caches give the same tokens, so the sampler's settings are read too.)"""
    import sinkdlm.evaluation.predictor as predictor

    model = tiny_model(block_size=4, num_sink_tokens=1, mask_token_id=46)
    pred = DLMPredictor(model, word_tokenizer(), ScoringOptions(progress=False, seed=SEED, kv_cache_dtype="int8"))
    seen = []
    monkeypatch.setattr(predictor, "sample", lambda *a, **kw: seen.append(kw) or generate(*a, **kw))
    assert pred.generate_ids(PROMPTS, 7, temperature=0.8) == _direct(model, 7, 7, kv_cache_dtype="int8")
    exact = pred.generate_ids(PROMPTS, 7, temperature=0.8, fast=False)
    assert exact == _direct(model, 7, 7, remasking="low_confidence")
    assert [(kw["cache"], kw["kv_cache_dtype"]) for kw in seen] == [(None, "int8"), (None, None)]


def test_a_block_model_refuses_cache_before_any_weight_is_read(tmp_path, monkeypatch):
    """eval and lm-eval refuse cache= on a block model as generate does (it would be dropped otherwise), from the
    model's header; a whole-sequence model's kv_cache_dtype still needs a cache."""
    import sinkdlm.checkpoint.manager as manager
    from sinkdlm.config.commands import EvalConfig
    from sinkdlm.evaluation.evaluator import evaluate_dir

    model = tiny_model(block_size=4, num_sink_tokens=1, mask_token_id=46)
    refusal = r"a block model decodes block by block .*cache=prefix does not apply to it"
    with pytest.raises(ValueError, match=refusal):
        DLMPredictor(model, word_tokenizer(), ScoringOptions(progress=False, cache="prefix"))
    with pytest.raises(ValueError, match="no cache is in use"):
        DLMPredictor(tiny_model(num_sink_tokens=1, mask_token_id=46), word_tokenizer(),
                     ScoringOptions(progress=False, kv_cache_dtype="int8"))
    ckpt = tmp_path / "block"
    model.save_pretrained(ckpt, tokenizer=word_tokenizer())

    def no_weights(*args, **kwargs):
        raise AssertionError("weights read before the options were checked")

    monkeypatch.setattr(manager, "load_checkpoint", no_weights)
    monkeypatch.setattr(manager, "load_model_and_tokenizer", no_weights)
    with pytest.raises(ValueError, match=refusal):
        evaluate_dir(EvalConfig(model=ckpt, tasks="shakespeare_cloze", cache="prefix", kv_cache_dtype="int8"))
    pytest.importorskip("lm_eval")
    from sinkdlm.evaluation.lm_eval_model import SinkDLMEvalModel

    with pytest.raises(ValueError, match=refusal):
        SinkDLMEvalModel.create_from_arg_obj(dict(pretrained=str(ckpt), cache="prefix"))
