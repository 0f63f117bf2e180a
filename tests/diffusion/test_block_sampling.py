"""Decoding a block model (docs/method.md §13) against a decoder written here that recomputes the whole prefix
at every step (block-causal attention as a mask of its own, on a whole-sequence twin), and a batch against each
row alone when one row stops at its end-of-text early. Float64 models: token parity across shapes (numerics.py)."""

from __future__ import annotations

import math

import pytest
import torch

from sinkdlm import DiffusionLM, generate
from sinkdlm.diffusion.sampling import StepProbe
from sinkdlm.model import Probe

from helpers import tiny_model


def twin(model: DiffusionLM) -> DiffusionLM:
    """The same weights as a whole-sequence model: block-causality is then only what the reference's mask says."""
    other = DiffusionLM(model.config.replace(block_size=None)).double().eval()
    other.load_state_dict(model.state_dict())
    return other


def reference(model: DiffusionLM, prompt: list[int], max_new: int, steps: int, sub: int | None = None) -> list[int]:
    """Greedy low-confidence block decoding, every step a fresh forward over the whole prefix up to the current
    block's end (end sinks: over the whole canvas, so that they sit after it as in the model's layout); blocks
    at absolute positions, LLaDA's even split of each block's masked count over ceil(steps / blocks) steps.
    Shifted logits (Fast-dLLM v2): column c is read from column c - 1, a block's first column at once, the argmax
    at the previous block's last column (docs/method.md §13). `sub`: sub-blocks of that length inside each block,
    left to right, only the current one's masked columns candidates, the block's steps split over them as LLaDA
    splits steps over its blocks (the remainder to the first), each one's masked count evenly over its share."""
    bs, mask_id, shift = model.config.block_size, model.config.mask_token_id, int(model.config.shift_logits)
    plain, end_sinks = twin(model), model.config.sink_position == "end" and model.config.num_sink_tokens > 0
    total = len(prompt) + max_new
    x = torch.tensor([prompt + [mask_id] * max_new])
    per_block = math.ceil(steps / math.ceil(max_new / bs))

    def read(lo, hi):  # [hi - lo, V] the logits that predict columns lo .. hi
        width = total if end_sinks else hi
        blocks = torch.arange(width) // bs
        mask = (blocks[:, None] >= blocks[None, :])[None, None]  # block-causal, written here
        logits = plain(x[:, :width], attention_mask=mask).logits[0]  # [width, V]
        logits = torch.cat([logits[:1], logits[:-1]]) if shift else logits  # row c: column c - 1's (c >= 1)
        logits = logits[lo:hi].clone()
        logits[:, mask_id] = float("-inf")
        return logits

    length = sub or bs
    shares = [per_block // (bs // length) + (j < per_block % (bs // length)) for j in range(bs // length)]
    for lo in range(len(prompt) // bs * bs, total, bs):
        hi = min(lo + bs, total)
        if shift and lo >= len(prompt):  # the block's first column, from the previous block's last
            x[0, lo] = read(lo, lo + 1)[0].argmax()
        for j, share in enumerate(shares):
            slo, shi = lo + j * length, min(lo + (j + 1) * length, hi)
            if slo >= shi:
                break
            masked = x[0, slo:shi] == mask_id
            m = int(masked.sum())
            counts = [k for k in (m // share + (i < m % share) for i in range(share)) if k]
            for k in counts:
                logits = read(lo, hi)[slo - lo:shi - lo]  # the whole block's pass, the sub-block's columns
                probs = torch.softmax(logits, -1)
                pred = probs.argmax(-1)
                conf = probs.gather(-1, pred[:, None])[:, 0].masked_fill(~masked, -1.0)
                pick = conf.topk(k).indices
                x[0, slo + pick] = pred[pick]
                masked[pick] = False
    return x[0, len(prompt):].tolist()


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("n,where", [(0, "front"), (1, "front"), (2, "end")])
@pytest.mark.parametrize("block_size,prompt_len,max_new", [(4, 5, 8), (3, 5, 8), (4, 8, 8), (5, 2, 7), (1, 3, 4)])
def test_cached_block_decoding_equals_recomputing_the_prefix(block_size, prompt_len, max_new, n, where, shift):
    model = tiny_model(block_size=block_size, num_sink_tokens=n, sink_position=where, shift_logits=shift)
    prompt = torch.randint(0, 40, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len)).tolist()
    steps = max_new  # one token a step
    got = generate(model, [prompt], max_new_tokens=max_new, steps=steps)[0, prompt_len:].tolist()
    assert got == reference(model, prompt, max_new, steps)
    fewer = generate(model, [prompt], max_new_tokens=max_new, steps=math.ceil(max_new / block_size))  # a block a step
    assert fewer[0, prompt_len:].tolist() == reference(model, prompt, max_new, math.ceil(max_new / block_size))


@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("n,where", [(0, "front"), (1, "front"), (2, "end")])
@pytest.mark.parametrize("block_size,sub,prompt_len,max_new", [(4, 2, 5, 8), (4, 1, 8, 7), (6, 2, 3, 10), (6, 3, 7, 9)])
def test_cached_sub_block_decoding_equals_recomputing_the_prefix(block_size, sub, prompt_len, max_new, n, where, shift):
    """Sub-blocks (block_length on a block model, Fast-dLLM v2's small_block_size): one token a step, and one
    step a sub-block (the whole sub-block at once), prompts ending inside a block and on its boundary."""
    model = tiny_model(block_size=block_size, num_sink_tokens=n, sink_position=where, shift_logits=shift)
    prompt = torch.randint(0, 40, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len)).tolist()
    blocks, subs = math.ceil(max_new / block_size), block_size // sub
    for steps in (blocks * block_size, blocks * subs):
        got = generate(model, [prompt], max_new_tokens=max_new, steps=steps, block_length=sub)[0, prompt_len:]
        assert got.tolist() == reference(model, prompt, max_new, steps, sub), steps


def test_sub_blocks_are_a_rule_of_their_own():
    """The sub-block tests above are not vacuous: in sub-blocks of 1 (left to right) some answers differ from the
    whole block's (a random tiny model does not denoise left to right)."""
    model = tiny_model(block_size=4, num_sink_tokens=1)
    prompts = [torch.randint(0, 40, (5,), generator=torch.Generator().manual_seed(k)).tolist() for k in range(4)]
    whole = generate(model, prompts, max_new_tokens=8, steps=8)
    ordered = generate(model, prompts, max_new_tokens=8, steps=8, block_length=1)
    assert not torch.equal(whole, ordered)


@pytest.mark.parametrize("kw", [dict(steps=8), dict(steps=3), dict(threshold=0.3), dict(temperature=0.8, steps=8),
                                dict(schedule="dream", remasking="entropy", steps=6, temperature=0.7),
                                dict(remasking="origin", schedule="dream", steps=6)])
@pytest.mark.parametrize("shift", [False, True])
def test_one_sub_block_the_size_of_the_block_is_todays_decoding(kw, shift):
    model = tiny_model(block_size=4, num_sink_tokens=1, shift_logits=shift)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12, 13]]
    plain = generate(model, prompts, max_new_tokens=9, seed=3, return_dict=True, **kw)
    same = generate(model, prompts, max_new_tokens=9, seed=3, return_dict=True, block_length=4, **kw)
    assert torch.equal(same.sequences, plain.sequences) and same.steps_taken == plain.steps_taken


@pytest.mark.parametrize("sub", [None, 2])
def test_a_row_that_stops_early_leaves_every_other_row_its_own_tokens(sub):
    """Rows of different lengths; the stop id is row 0's first generated token, so row 0 ends after its first
    block. Every row equals its decoding alone, and the stopped row is not computed further (the batch shrinks);
    in sub-blocks too."""
    model = tiny_model(block_size=4, num_sink_tokens=1)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 40, (n,), generator=g).tolist() for n in (3, 6, 9)]
    settings = dict(max_new_tokens=12, steps=12, block_length=sub)
    stop = generate(model, [prompts[0]], **settings)[0, 3].item()
    alone = [generate(model, [p], stop_token_ids=(stop,), **settings)[0, len(p):].tolist() for p in prompts]
    seen = []
    hook = model.embed_tokens.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[0]))
    batch = generate(model, prompts, stop_token_ids=(stop,), return_dict=True, **settings)
    hook.remove()
    width = batch.prompt_length
    assert [batch.sequences[i, width:].tolist() for i in range(3)] == alone
    assert alone[0] == [stop] * 12  # row 0 stopped at once: the rest is the stop id
    assert any(stop not in row for row in alone[1:])  # another row went on to its bound
    assert seen[0] == 3 and seen[-1] < 3  # the stopped row left the batch


@pytest.mark.parametrize("kw", [dict(temperature=1.0, steps=12), dict(remasking="random", steps=5),
                                dict(threshold=0.3, temperature=0.5), dict(schedule="dream", remasking="entropy",
                                                                           steps=6, temperature=0.7),
                                dict(temperature=1.0, steps=12, block_length=2), dict(threshold=0.3, block_length=1),
                                dict(schedule="dream", remasking="entropy", steps=6, temperature=0.7,
                                     block_length=2)])
@pytest.mark.parametrize("shift", [False, True])
def test_sampled_rows_get_their_own_tokens_in_a_batch(kw, shift):
    """With `seed` every row draws from its own stream, and only at the steps it would run alone (a row whose
    block is done, or whose even split commits nothing, draws nothing): sampled rows too are their own. Shifted
    logits: a block's first token is drawn only by the rows that generate it (prompts of 4 and 8 end on a block)."""
    model = tiny_model(block_size=4, num_sink_tokens=1, shift_logits=shift)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 40, (n,), generator=g).tolist() for n in ((3, 6, 9) if not shift else (3, 4, 8))]
    alone = [generate(model, [p], max_new_tokens=10, seed=5, **kw)[0, len(p):].tolist() for p in prompts]
    batch = generate(model, prompts, max_new_tokens=10, seed=5, return_dict=True, **kw)
    assert [batch.sequences[i, batch.prompt_length:].tolist() for i in range(3)] == alone


def test_threshold_and_random_remasking_run_and_fill_the_bound():
    model = tiny_model(block_size=4)
    for kw in (dict(threshold=0.0), dict(steps=6, remasking="random", temperature=1.0)):
        out = generate(model, [[1, 2, 3]], max_new_tokens=6, **kw)
        assert out.shape == (1, 9) and not (out == model.config.mask_token_id).any()


@pytest.mark.parametrize("kw,match", [
    (dict(block_length=3), "block_length=3 does not divide the model's block_size=4"),
    (dict(block_length=1, steps=5), r"steps=5 split over 2 blocks gives a block 3 steps, fewer than its 4 sub-blocks"
                                    r" \(block_size=4 / block_length=1\).*give at least steps=7"),
    (dict(cache="prefix"), "cache"),
    (dict(probe=StepProbe(key_masks=lambda step, previous: None)), "key masks"),
    (dict(max_new_tokens=200), "does not fit"),
])
def test_block_model_refuses_what_does_not_apply(kw, match):
    model = tiny_model(block_size=4)
    with pytest.raises(ValueError, match=match):
        generate(model, [[1, 2, 3]], **{"max_new_tokens": 8, "steps": 8, **kw})


def test_max_new_tokens_on_a_whole_sequence_or_autoregressive_model_is_refused():
    with pytest.raises(ValueError, match="whole-sequence model generates exactly gen_length"):
        generate(tiny_model(), [[1, 2, 3]], max_new_tokens=8, steps=8)
    causal = tiny_model(causal=True, shift_logits=True, mask_token_id=None)
    with pytest.raises(ValueError, match="autoregressive.*max_new_tokens=8"):
        generate(causal, [[1, 2, 3]], max_new_tokens=8)


def test_generate_text_gives_a_block_model_its_stop_ids(monkeypatch):
    """The text path (generate, chat, lm-eval's generate_until) hands a block model the end-of-text ids, so that it
    stops decoding a row there, as an autoregressive model does."""
    import sinkdlm.diffusion.text as text

    from helpers import word_tokenizer

    tok = word_tokenizer()
    tok.add_special_tokens({"eos_token": "w3"})
    model = tiny_model(block_size=4, mask_token_id=46)
    seen, real = {}, text.generate

    def spy(model, ids, settings, **kw):
        seen["stops"] = settings.stop_token_ids
        return real(model, ids, settings, **kw)

    monkeypatch.setattr(text, "generate", spy)
    out = text.generate_text(model, tok, "w1 w2", gen_length=8, steps=8)  # a block model: an upper bound
    assert seen["stops"] == (tok.eos_token_id,) and len(out.tokens) == 8


def test_a_callback_is_told_each_finished_block_and_changes_no_token():
    """generate(callback=) on a block model: one call per finished block, rows of different prompt lengths; each
    call's newly final columns follow the last, its tokens there are the final answer's, every generated column is
    final by the end, and the tokens equal a call without a callback."""
    model = tiny_model(block_size=4, num_sink_tokens=1)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 40, (n,), generator=g).tolist() for n in (3, 6)]
    settings = dict(max_new_tokens=10, steps=10, temperature=0.8, seed=5)
    plain = generate(model, prompts, **settings)
    states = []
    out = generate(model, prompts, callback=states.append, **settings)
    assert torch.equal(out, plain)
    p = out.shape[1] - 10
    seen = torch.zeros_like(out, dtype=torch.bool)
    seen[:, :p] = True
    assert len(states) >= 3 and [s.block for s in states] == sorted(s.block for s in states)
    for s in states:
        assert torch.equal(s.masked, ~seen)  # not final before this block
        assert not (s.committed & seen).any()  # only new columns become final
        seen |= s.committed
        assert torch.equal(s.x[seen], out[seen])  # what is final is the answer
    assert seen.all()


@pytest.mark.parametrize("n,where", [(0, "front"), (1, "front"), (2, "end")])
def test_an_analysed_block_decoding_sees_square_block_causal_maps_and_decodes_the_same_tokens(n, where):
    """With a probe (the analysis), each step runs the whole canvas without the cache: the tokens are still the
    reference decoder's, every step's maps cover every column and the sinks (square), a query attends nothing in
    a later block, and a sink attends only to the sinks (eq. 6)."""
    model = tiny_model(block_size=4, num_sink_tokens=n, sink_position=where)
    prompts = [torch.randint(0, 40, (k,), generator=torch.Generator().manual_seed(k)).tolist() for k in (5, 7)]
    seen: list[tuple[int, int, torch.Tensor, torch.Tensor]] = []

    def step_hook(step, input_ids, attention_mask):
        def hook(layer, attn, values, column=None):
            seen.append((step, layer, attn.detach().clone(), attention_mask.clone()))
        return hook

    probed = generate(model, prompts, max_new_tokens=8, steps=8, probe=StepProbe(hook=step_hook), return_dict=True)
    plain = generate(model, prompts, max_new_tokens=8, steps=8, return_dict=True)
    assert probed.sequences.tolist() == plain.sequences.tolist()
    for i, p in enumerate(prompts):
        assert probed.sequences[i, probed.prompt_length:].tolist() == reference(model, p, 8, 8)
    steps = sorted({s for s, *_ in seen})
    assert steps == list(range(probed.steps_taken)) and len(seen) == len(steps) * model.config.num_hidden_layers
    assert len(steps) >= 8  # at least one token a step
    for _, _, attn, real in seen:
        width = real.shape[1]
        assert attn.shape[-2:] == (width + n, width + n)
        content = slice(n, n + width) if where == "front" else slice(0, width)
        sinks = list(range(n)) if where == "front" else list(range(width, width + n))
        blocks = torch.arange(width) // 4
        later = blocks[None, :] > blocks[:, None]  # [q, k] a key in a later block than its query
        c2c = attn[:, :, content, content]
        assert float(c2c.masked_select(later.expand_as(c2c)).abs().sum()) == 0.0
        if n:
            others = [j for j in range(width + n) if j not in sinks]
            assert float(attn[:, :, sinks][..., others].abs().max()) == 0.0


# ~10-15 s each (inductor-free aot_eager compiles): the default run keeps (4, 2, True), two sinks and shifted logits;
# one sink unshifted, and a block size that does not divide the length, run with the slow ones
@pytest.mark.parametrize("block_size,n,shift", [pytest.param(4, 1, False, marks=pytest.mark.slow),
                                                pytest.param(3, 2, False, marks=pytest.mark.slow), (4, 2, True)])
def test_compiled_block_decoding_gives_the_eager_tokens(block_size, n, shift):
    """compile=True (the CPU proxy of CUDA graphs: aot_eager) runs each denoising step through one compiled graph
    per shape, the block's first column a tensor; the tokens are the eager decoding's, a row stopping early
    included (the batch then changes shape), and the compile time is reported; shifted logits too."""
    model = tiny_model(block_size=block_size, num_sink_tokens=n, shift_logits=shift)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 40, (k,), generator=g).tolist() for k in (3, 6)]
    settings = dict(max_new_tokens=9, steps=9)
    stop = generate(model, [prompts[0]], **settings)[0, 4].item()
    eager = generate(model, prompts, stop_token_ids=(stop,), return_dict=True, **settings)
    compiled = generate(model, prompts, stop_token_ids=(stop,), return_dict=True, compile=True,
                        compile_backend="aot_eager", **settings)
    assert compiled.sequences.tolist() == eager.sequences.tolist()
    assert compiled.compile_seconds > 0 and eager.compile_seconds is None


def _block_causal_twin_maps(model: DiffusionLM, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Every layer's maps of one row `x [1, W]` (every column real) on the whole-sequence twin under a block-causal
    mask written here: the reference for a probed step's recorded attention."""
    blocks = torch.arange(x.shape[1]) // model.config.block_size
    mask = (blocks[:, None] >= blocks[None, :])[None, None]
    with torch.no_grad():
        return twin(model)(x, attention_mask=mask, probe=Probe(attentions=True)).attentions


@pytest.mark.parametrize("n,where", [(0, "front"), (1, "front"), (2, "end")])
def test_an_analysed_shifted_block_decoding_decodes_the_same_tokens_and_records_only_denoising_steps(n, where):
    """Shifted logits (Fast-dLLM v2) with a probe: the tokens are the unprobed decoding's and the reference
    decoder's (a prompt inside a block and one ending on a block boundary, whose first generated column the
    prefill reads); each block's first column is read by an unrecorded pass before the block's steps, so every
    recorded step already has its block's first column, and the recorded steps are only the denoising steps
    (steps_taken counts those passes too)."""
    model = tiny_model(block_size=4, num_sink_tokens=n, sink_position=where, shift_logits=True)
    mask_id = model.config.mask_token_id
    prompts = [torch.randint(0, 40, (k,), generator=torch.Generator().manual_seed(k)).tolist() for k in (5, 8)]
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    layers: list[int] = []

    def step_hook(step, input_ids, attention_mask):
        seen[step] = (input_ids.clone(), attention_mask.clone())
        return lambda layer, attn, values, column=None: layers.append(layer)

    probed = generate(model, prompts, max_new_tokens=8, steps=8, probe=StepProbe(hook=step_hook), return_dict=True)
    plain = generate(model, prompts, max_new_tokens=8, steps=8, return_dict=True)
    assert probed.sequences.tolist() == plain.sequences.tolist()
    for i, p in enumerate(prompts):
        assert probed.sequences[i, probed.prompt_length:].tolist() == reference(model, p, 8, 8)
    assert sorted(seen) == list(range(len(seen))) and len(layers) == len(seen) * model.config.num_hidden_layers
    first_columns = set()
    for x, real in seen.values():
        for row in range(x.shape[0]):
            masked = ((x[row] == mask_id) & real[row]).nonzero()
            if len(masked):  # the block this step denoises in the row: its first column is committed already
                lo = int(masked[0]) // 4 * 4
                assert x[row, lo] != mask_id
                first_columns.add((row, lo))
    assert len(first_columns) >= 4
    # one unrecorded pass a generated block (the first block's from the prefill's place), none after the last
    assert probed.steps_taken == len(seen) + 3 == plain.steps_taken


def test_a_shifted_block_steps_recorded_attention_is_the_block_causal_forward_of_its_canvas():
    """Each recorded step's maps (the whole canvas, sinks included) equal the whole-sequence twin's forward over
    that step's tokens under a block-causal mask written here, in float64; a block's steps see the next block's first
    column still [MASK] (it is read after the block, unrecorded), the next block's first step sees it read."""
    model = tiny_model(block_size=4, num_sink_tokens=1, shift_logits=True)
    mask_id = model.config.mask_token_id
    prompt = torch.randint(0, 40, (5,), generator=torch.Generator().manual_seed(5)).tolist()  # 5 + 7: 3 whole blocks
    recorded: dict[tuple[int, int], torch.Tensor] = {}
    canvases: dict[int, torch.Tensor] = {}

    def step_hook(step, input_ids, attention_mask):
        assert bool(attention_mask.all())  # every column real: the twin needs no padding
        canvases[step] = input_ids.clone()

        def hook(layer, attn, values, column=None):
            recorded[step, layer] = attn.detach().clone()
        return hook

    out = generate(model, [prompt], max_new_tokens=7, steps=7, probe=StepProbe(hook=step_hook), return_dict=True)
    assert out.sequences[0, 5:].tolist() == reference(model, prompt, 7, 7)
    for step, x in canvases.items():
        maps = _block_causal_twin_maps(model, x)
        for layer, ref in enumerate(maps):
            assert recorded[step, layer].shape == ref.shape == (1, 4, 13, 13)
            torch.testing.assert_close(recorded[step, layer], ref, rtol=1e-12, atol=1e-12)
    # block 1 (columns 4 .. 8) is denoised with column 8 unread; block 2's steps see it read, the rest masked
    assert any(bool(x[0, 8] == mask_id) and bool(x[0, 5:8].eq(mask_id).any()) for x in canvases.values())
    assert any(bool(x[0, 8] != mask_id) and bool(x[0, 9:].eq(mask_id).all()) for x in canvases.values())
