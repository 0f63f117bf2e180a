"""The samplers (docs/method.md §2) against a plain LLaDA / Fast-dLLM loop written here, on tiny random models.

float64 models: confidences of a random model are close together, and the batched/padded and
single-row forwards must not differ by rounding where the tests ask for identical tokens.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn.functional as F

from sinkdlm import DiffusionLM, ModelConfig, generate
from sinkdlm.config import SampleConfig
from sinkdlm.diffusion.remasking import add_gumbel_noise, transfer_schedule
from sinkdlm.diffusion.sampling import StepProbe, StepState
from sinkdlm.model import Probe

VARIANTS = {
    "vanilla": dict(num_sink_tokens=0),
    "sink-front": dict(num_sink_tokens=1),
    "2sinks-end": dict(num_sink_tokens=2, sink_position="end"),
}


def tiny_model(seed: int = 0, **kw) -> DiffusionLM:
    cfg = dict(
        vocab_size=48, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, max_position_embeddings=96, initializer_range=0.3,  # peaked, varied predictions
    )
    torch.manual_seed(seed)
    return DiffusionLM(ModelConfig(**{**cfg, **kw})).double().eval()


@pytest.fixture(params=list(VARIANTS))
def model(request):
    return tiny_model(**VARIANTS[request.param])


def prompts(b: int, p: int, model, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.mask_token_id, (b, p), generator=g)


# ----------------------------------------------------------------------------- the reference (docs/method.md §2)
def llada_num_transfer_tokens(mask_index: torch.Tensor, steps: int) -> torch.Tensor:
    """LLaDA's get_num_transfer_tokens, verbatim."""
    mask_num = mask_index.sum(dim=1, keepdim=True)
    base = mask_num // steps
    remainder = mask_num % steps
    num = torch.zeros(mask_num.size(0), steps, dtype=torch.int64) + base
    for i in range(mask_num.size(0)):
        num[i, : remainder[i]] += 1
    return num


@torch.no_grad()
def reference_generate(model, prompt, gen_length, steps, block_length, threshold=None, shift_logits=False):
    """LLaDA's generate() (temperature 0, low-confidence remasking) and, with `threshold`, Fast-dLLM's
    loop; written plainly: full-sequence softmax, a loop over rows, the sinks recomputed at every
    step (no cache). One change from LLaDA: the [MASK] id is never predicted."""
    mask_id = model.config.mask_token_id
    b, p = prompt.shape
    x = torch.full((b, p + gen_length), mask_id, dtype=torch.long)
    x[:, :p] = prompt
    num_blocks = gen_length // block_length
    steps_per_block = steps // num_blocks if steps else None
    for nb in range(num_blocks):
        lo, hi = p + nb * block_length, p + (nb + 1) * block_length
        if threshold is None:
            num_transfer = llada_num_transfer_tokens(x[:, lo:hi] == mask_id, steps_per_block)
        i = 0
        while (x[:, lo:hi] == mask_id).any():
            with model.sink_cache_mode(False):
                logits = model(x).logits
            if shift_logits:
                logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
            logits[..., mask_id] = float("-inf")
            x0 = logits.argmax(-1)
            x0_p = torch.gather(F.softmax(logits, dim=-1), -1, x0[..., None]).squeeze(-1)
            x0_p[:, hi:] = float("-inf")
            mask_index = x == mask_id
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, torch.tensor(float("-inf"), dtype=x0_p.dtype))
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(b):
                if threshold is None:
                    _, sel = torch.topk(confidence[j], k=int(num_transfer[j, i]))
                    transfer[j, sel] = True
                else:
                    k = int(mask_index[j, lo:hi].sum())
                    if k == 0:
                        continue
                    _, sel = torch.topk(confidence[j], k=k)
                    transfer[j, sel[0]] = True
                    for s in sel[1:]:
                        if confidence[j, s] > threshold:
                            transfer[j, s] = True
            x[transfer] = x0[transfer]
            i += 1
    return x


# ----------------------------------------------------------------------------- equality with the reference
@pytest.mark.parametrize(
    "gen_length,steps,block_length",
    [(16, 16, None), (16, 8, 8), (16, 6, 8), (12, 6, 4), (8, 20, None)],  # 20 > 8: zero-commit steps
)
def test_matches_reference_sampler(model, gen_length, steps, block_length):
    prompt = prompts(2, 5, model)
    got = generate(model, prompt, gen_length=gen_length, steps=steps, block_length=block_length, return_dict=True)
    want = reference_generate(model, prompt, gen_length, steps, block_length or gen_length)
    assert torch.equal(got.sequences, want)
    assert got.steps_taken == min(steps, gen_length)  # steps that would commit nothing are not run


@pytest.mark.parametrize("threshold", [0.05, 0.2, 0.6])
def test_threshold_matches_fast_dllm_reference(model, threshold):
    prompt = prompts(3, 4, model)
    got = generate(model, prompt, gen_length=16, steps=None, block_length=8, threshold=threshold, return_dict=True)
    want = reference_generate(model, prompt, 16, None, 8, threshold=threshold)
    assert torch.equal(got.sequences, want)


def test_shift_logits_matches_reference():
    model = tiny_model(num_sink_tokens=1)
    prompt = prompts(2, 4, model)
    got = generate(model, prompt, gen_length=8, steps=8, block_length=4, shift_logits=True)
    assert torch.equal(got, reference_generate(model, prompt, 8, 8, 4, shift_logits=True))


def test_threshold_one_is_one_token_per_step(model):
    """Nothing exceeds 1.0, so only the forced most-confident position commits: the k=1 sampler."""
    prompt = prompts(2, 4, model)
    a = generate(model, prompt, gen_length=12, steps=None, block_length=4, threshold=1.0, return_dict=True)
    b = generate(model, prompt, gen_length=12, steps=12, block_length=4)
    assert torch.equal(a.sequences, b) and a.steps_taken == 12


# ----------------------------------------------------------------------------- schedule, blocks, threshold
class Recorder:
    def __init__(self):
        self.states: list[StepState] = []

    def __call__(self, state: StepState) -> None:
        self.states.append(state)


@pytest.mark.parametrize("remasking,temperature", [("low_confidence", 0.0), ("random", 0.0), ("low_confidence", 0.8)])
def test_block_constraint_and_schedule(remasking, temperature):
    model = tiny_model(num_sink_tokens=1)
    p, gen, blk, steps = 3, 12, 4, 9  # 3 blocks x 3 steps
    rec = Recorder()
    out = generate(model, prompts(2, p, model), gen_length=gen, steps=steps, block_length=blk, temperature=temperature,
                   remasking=remasking, seed=0, callback=rec)
    assert [s.step for s in rec.states] == list(range(9))
    assert [s.block for s in rec.states] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    for s in rec.states:
        lo, hi = p + s.block * blk, p + (s.block + 1) * blk
        assert not s.masked[:, :lo].any(), "an earlier block is unfinished"
        assert s.masked[:, hi:].all(), "a later block was committed early"
        assert not s.committed[:, :lo].any() and not s.committed[:, hi:].any()
        assert (s.committed <= s.masked).all()
        # LLaDA's schedule: 4 tokens over 3 steps -> 2, 1, 1 in every row
        assert s.committed.sum(-1).tolist() == [transfer_schedule(blk, 3)[s.step % 3]] * 2
    assert transfer_schedule(blk, 3) == llada_num_transfer_tokens(torch.ones(1, blk, dtype=torch.bool), 3)[0].tolist()
    assert torch.equal(rec.states[-1].x, out)


@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.9, 1.0])
def test_threshold_commits_at_least_one_per_step_and_finishes(threshold):
    model = tiny_model(num_sink_tokens=1)
    p, gen, blk = 3, 16, 8
    rec = Recorder()
    out = generate(model, prompts(3, p, model), gen_length=gen, steps=None, block_length=blk, threshold=threshold,
                   callback=rec, return_dict=True)
    assert out.steps_taken == len(rec.states) <= gen
    if threshold == 0.0:
        assert out.steps_taken == gen // blk  # every confidence exceeds 0: one step per block
    for s in rec.states:
        lo, hi = p + s.block * blk, p + (s.block + 1) * blk
        busy = s.masked[:, lo:hi].any(-1)  # rows whose block is unfinished
        n = s.committed.sum(-1)
        assert (n[busy] >= 1).all() and (n[~busy] == 0).all()
    assert not (out.sequences == model.config.mask_token_id).any()


# ----------------------------------------------------------------------------- batching and padding
@pytest.mark.parametrize("threshold", [None, 0.3])
def test_mixed_length_batch_equals_single_rows(model, threshold):
    rows = [prompts(1, n, model, seed=n)[0] for n in (3, 7, 5)]
    steps = None if threshold else 12
    out = generate(model, rows, gen_length=12, steps=steps, block_length=4, threshold=threshold, pad_token_id=0, return_dict=True)
    assert out.prompt_length == 7 and out.sequences.shape == (3, 19)
    for i, r in enumerate(rows):
        alone = generate(model, r, gen_length=12, steps=steps, block_length=4, threshold=threshold)
        assert torch.equal(out.sequences[i, 7 - len(r):], alone[0]), f"row {i}"
        assert (out.sequences[i, : 7 - len(r)] == 0).all()  # padding kept
        assert out.attention_mask[i].sum() == len(r) + 12


def test_padded_tensor_with_attention_mask_equals_list_input():
    model = tiny_model(num_sink_tokens=2, sink_position="end")
    rows = [[5, 6, 7, 8], [9, 10]]
    ids = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]])
    am = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    a = generate(model, rows, gen_length=8, steps=8, pad_token_id=0)
    b = generate(model, ids, gen_length=8, steps=8, attention_mask=am)
    assert torch.equal(a, b)


# ----------------------------------------------------------------------------- sink cache (docs/method.md §3)
def test_sink_cache_on_equals_off_and_is_computed_once(monkeypatch):
    model = tiny_model(num_sink_tokens=2)
    calls = {"n": 0}
    real = model.sink_stream

    def counting():
        calls["n"] += 1
        return real()

    monkeypatch.setattr(model, "sink_stream", counting)
    prompt = prompts(2, 4, model)
    logs = {True: [], False: []}
    outs = {}
    for use in (True, False):
        calls["n"] = 0
        outs[use] = generate(model, prompt, gen_length=16, steps=16, block_length=8, use_sink_cache=use,
                             callback=lambda s, use=use: logs[use].append(s.logits))
        if use:  # a second request reuses the same constants
            generate(model, prompt, gen_length=16, steps=16, block_length=8, use_sink_cache=True)
        assert calls["n"] == (1 if use else 16)
    assert torch.equal(outs[True], outs[False])
    assert all(torch.equal(a, b) for a, b in zip(logs[True], logs[False]))


# ----------------------------------------------------------------------------- invariants and sampling
def test_prompt_unchanged_no_mask_left_and_seed_repeats():
    model = tiny_model(num_sink_tokens=1)
    mask_id = model.config.mask_token_id
    prompt = prompts(2, 6, model)
    prompt[0, 2] = mask_id  # a [MASK] inside the prompt is left alone
    kw = dict(block_length=5, temperature=1.0, remasking="random")
    a = generate(model, prompt, gen_length=10, steps=10, seed=3, **kw)
    b = generate(model, prompt, gen_length=10, steps=10, seed=3, **kw)
    c = generate(model, prompt, gen_length=10, steps=10, seed=4, **kw)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert torch.equal(a[:, :6], prompt)
    assert not (a[:, 6:] == mask_id).any()
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    assert torch.equal(generate(model, prompt, gen_length=10, steps=5, generator=g1, temperature=0.5),
                       generate(model, prompt, gen_length=10, steps=5, generator=g2, temperature=0.5))


def test_gumbel_noise_samples_the_tempered_softmax():
    logits = torch.tensor([1.0, 0.0, -0.5, 2.0])
    g = torch.Generator().manual_seed(0)
    n = 40000
    for temperature in (1.0, 0.5):
        draws = add_gumbel_noise(logits.expand(n, -1), temperature, g).argmax(-1)
        freq = torch.bincount(draws, minlength=4).double() / n
        want = torch.softmax(logits.double() / temperature, -1)
        assert torch.allclose(freq, want, atol=0.01), (temperature, freq, want)
    assert add_gumbel_noise(logits, 0.0) is logits


# ----------------------------------------------------------------------------- the callback contract
def test_callback_state_matches_the_model():
    model = tiny_model(num_sink_tokens=1)
    cfg = model.config
    rows = [[1, 2, 3, 4], [5, 6]]
    rec = Recorder()
    generate(model, rows, gen_length=8, steps=4, block_length=4, callback=rec, probe=StepProbe(attentions=True, values=True))
    assert len(rec.states) == 4
    s_len = 4 + 8 + 1
    for s in rec.states:
        assert s.x.shape == s.masked.shape == s.committed.shape == (2, 12)
        assert len(s.attentions) == len(s.values) == cfg.num_hidden_layers
        assert s.attentions[0].shape == (2, cfg.num_attention_heads, s_len, s_len)
        assert s.values[0].shape == (2, cfg.num_key_value_heads, s_len, cfg.head_dim)
        # The recorded logits and maps are those of the tokens the model saw at this step.
        ref = model(s.input_ids, attention_mask=s.attention_mask, probe=Probe(attentions=True))
        assert torch.allclose(ref.logits, s.logits)
        assert torch.allclose(ref.attentions[1], s.attentions[1])
        assert torch.equal(s.x[s.committed], s.logits.argmax(-1)[s.committed])  # greedy commits


def test_key_masks_fn_gets_previous_state_and_masks_keys():
    model = tiny_model(num_sink_tokens=1)
    cfg = model.config
    seen = []
    h, s_len = cfg.num_attention_heads, 4 + 8 + 1

    def no_sink(step, prev):
        seen.append((step, None if prev is None else prev.step, prev is not None and prev.attentions is not None))
        km = torch.ones(2, h, s_len, dtype=torch.bool)
        km[:, :, 0] = False  # the front sink key
        return [km] * cfg.num_hidden_layers

    rec = Recorder()
    prompt = prompts(2, 4, model)
    generate(model, prompt, gen_length=8, steps=4, probe=StepProbe(key_masks=no_sink, attentions=True), callback=rec)
    assert seen == [(0, None, False), (1, 0, True), (2, 1, True), (3, 2, True)]
    km = no_sink(0, None)
    for s in rec.states:
        assert s.attentions[0][:, :, 1:, 0].abs().max() == 0  # no content query reaches the sink
        assert torch.allclose(model(s.input_ids, probe=Probe(key_masks=km, backend="eager")).logits, s.logits)
    allow_all = generate(model, prompt, gen_length=8, steps=4, probe=StepProbe(key_masks=lambda step, prev: None))
    assert torch.equal(allow_all, generate(model, prompt, gen_length=8, steps=4))


@pytest.mark.slow  # ~20 s: make test-slow
def test_no_per_step_tensors_are_kept():
    """Memory stays flat: a step's tensors die once the next step starts (one step later with a
    key_masks_fn, which is handed the previous state)."""
    model = tiny_model(num_sink_tokens=1)
    for lag, fn in ((1, None), (2, lambda step, prev: None)):
        refs = []

        def watch(state, refs=refs, lag=lag):
            gc.collect()
            for old in refs[:-lag] if len(refs) >= lag else []:
                assert all(r() is None for r in old), "an old step's tensors are still alive"
            refs.append([weakref.ref(t) for t in (state.x, state.masked, state.committed, state.logits)])

        generate(model, prompts(1, 4, model), gen_length=8, steps=8, callback=watch, probe=StepProbe(key_masks=fn))
        assert len(refs) == 8


# ----------------------------------------------------------------------------- user errors
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(gen_length=10, steps=10, block_length=4), "not divisible by block_length"),
        (dict(gen_length=16, steps=3, block_length=4), "fewer than the number of blocks"),
        (dict(gen_length=0, steps=4), "gen_length must be"),
        (dict(gen_length=8, steps=None), "steps is required"),
        (dict(gen_length=8, steps=0), "steps must be"),
        (dict(gen_length=8, steps=8, temperature=-1.0), "temperature"),
        (dict(gen_length=8, steps=8, remasking="top"), "remasking must be one of"),
        (dict(gen_length=8, steps=8, threshold=1.5), "threshold must be"),
        (dict(gen_length=8, steps=8, threshold=0.9, remasking="random"), "threshold decoding needs"),
        (dict(gen_length=90, steps=90), r"is longer than the model's \d+ .*positions"),
        (dict(gen_length=8, steps=8, seed=1, generator=torch.Generator()), "either generator or seed"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs, match):
    model = tiny_model(num_sink_tokens=1)
    with pytest.raises(ValueError, match=match):
        generate(model, prompts(1, 8, model), **kwargs)


@pytest.mark.parametrize(
    "prompt,match",
    [
        (torch.zeros(1, 0, dtype=torch.long), "empty prompt"),
        ([], "empty prompt"),
        ([[1, 2], []], "no real token"),
        (torch.tensor([[1.0, 2.0]]), "integer token ids"),
        (torch.tensor([[1, 99]]), "vocab_size"),
        (torch.ones(2, 2, 2, dtype=torch.long), r"\[length\] or \[batch, length\]"),
    ],
)
def test_bad_prompts_raise_clear_errors(prompt, match):
    model = tiny_model()
    with pytest.raises(ValueError, match=match):
        generate(model, prompt, gen_length=8, steps=8)


def test_right_padding_is_rejected():
    model = tiny_model()
    with pytest.raises(ValueError, match="left-padded"):
        generate(model, torch.tensor([[1, 2, 0]]), gen_length=8, steps=8, attention_mask=torch.tensor([[1, 1, 0]]))


def test_sample_config_and_keyword_overrides_agree():
    """`generate(model, ids, SampleConfig(...), **overrides)` = the same settings as keywords; an unknown
    keyword is refused with the valid names."""
    model = tiny_model(num_sink_tokens=1)
    prompt = prompts(2, 4, model)
    config = SampleConfig(gen_length=8, steps=8, block_length=4, temperature=0.7, seed=2)
    want = generate(model, prompt, gen_length=8, steps=8, block_length=4, temperature=0.7, seed=2)
    assert torch.equal(generate(model, prompt, config), want)
    other = SampleConfig(gen_length=8, steps=4, block_length=8, temperature=0.7, seed=9)
    assert torch.equal(generate(model, prompt, other, steps=8, block_length=4, seed=2), want)
    assert other.steps == 4  # the caller's config is not changed
    with pytest.raises(TypeError, match="gen_lenght.*gen_length, steps, block_length"):
        generate(model, prompt, gen_lenght=8, steps=8)
    with pytest.raises(TypeError, match="needs gen_length"):
        generate(model, prompt, steps=8)


def test_step_probe_is_the_one_analysis_argument():
    """`generate(probe=StepProbe(...))` replaces the four analysis keywords; probes combine with `|`."""
    masks, hook = (lambda step, prev: None), (lambda step, ids, attn: None)
    both = StepProbe(key_masks=masks, attentions=True) | StepProbe(hook=hook, values=True)
    assert (both.key_masks, both.hook, both.attentions, both.values) == (masks, hook, True, True)
    with pytest.raises(ValueError, match="both probes set key_masks"):
        StepProbe(key_masks=masks) | StepProbe(key_masks=masks)
    model = tiny_model()
    with pytest.raises(ValueError, match="probe must be a StepProbe"):
        generate(model, [1, 2], gen_length=4, steps=2, probe=Probe(attentions=True))
    with pytest.raises(TypeError):
        generate(model, [1, 2], gen_length=4, steps=2, output_attentions=True)
    states = []
    generate(model, [1, 2], gen_length=4, steps=2, probe=both, callback=states.append)
    assert all(s.attentions is not None and s.values is not None for s in states)
