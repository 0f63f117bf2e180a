"""A batch changes no row's tokens (issue 67): every row of `generate` over prompts of mixed lengths equals that
prompt decoded alone (the independent reference), greedy and sampled with a seed, for every remasking rule,
cache and threshold, for a DLM and an autoregressive model. float64 models, so the batch's padded matmul shapes
cannot flip a near-tie by rounding (CONTRIBUTING's rule 3): what is tested is the random streams and the masks.
"""

from __future__ import annotations

import pytest
import torch

from helpers import tiny_model
from sinkdlm import generate

LENGTHS = (7, 2, 5)  # mixed prompt lengths: rows 2 and 3 are left-padded in the batch


def _prompts(model, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, model.config.mask_token_id, (n,), generator=g).tolist() for n in LENGTHS]


def _assert_rows_alone(model, rows, **kw):
    batch = generate(model, rows, return_dict=True, **kw)
    width = batch.prompt_length
    for i, r in enumerate(rows):
        alone = generate(model, r, **kw)
        # integer tokens; both sides draw row i's numbers from a generator seeded alike
        assert torch.equal(batch.sequences[i, width - len(r):], alone[0]), f"row {i} ({len(r)} tokens) with {kw}"


SETTINGS = [
    dict(remasking="low_confidence"),
    dict(remasking="random"),
    dict(remasking="low_confidence", cache="prefix"),
    dict(remasking="low_confidence", cache="dual"),
    dict(remasking="low_confidence", threshold=0.3),
    dict(remasking="low_confidence", threshold=0.3, cache="dual"),
    dict(remasking="topk_margin", alg_temp=0.5),
    dict(remasking="entropy", top_p=0.9, top_k=20),
    dict(remasking="maskgit_plus", schedule="dream"),
    dict(remasking="origin", schedule="dream"),
]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_every_row_of_a_batch_is_the_row_alone(settings, temperature):
    model = tiny_model(num_sink_tokens=1)
    _assert_rows_alone(model, _prompts(model), gen_length=12, steps=6, block_length=4, temperature=temperature,
                       seed=1234, **settings)


def test_an_autoregressive_batch_samples_each_row_as_alone():
    model = tiny_model(causal=True, shift_logits=True, mask_token_id=None)
    rows = [torch.randint(0, 40, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in LENGTHS]
    _assert_rows_alone(model, rows, gen_length=6, temperature=0.8, seed=5)


def test_per_row_generators_give_each_row_its_own_seed():
    model = tiny_model(num_sink_tokens=1)
    rows = _prompts(model)
    kw = dict(gen_length=8, steps=8, temperature=1.0, remasking="random")
    batch = generate(model, rows, generator=[torch.Generator().manual_seed(s) for s in (3, 4, 5)], **kw)
    width = max(LENGTHS)
    for i, (r, seed) in enumerate(zip(rows, (3, 4, 5))):
        assert torch.equal(batch[i, width - len(r):], generate(model, r, seed=seed, **kw)[0]), f"row {i}"
    with pytest.raises(ValueError, match="one per prompt"):
        generate(model, rows, generator=[torch.Generator()], **kw)


def test_one_row_with_a_seed_draws_what_one_generator_seeded_alike_draws():
    # the per-row stream of a single row reads the numbers the shared generator read before issue 67
    model = tiny_model(num_sink_tokens=1)
    row = _prompts(model)[0]
    kw = dict(gen_length=8, steps=4, temperature=0.9, remasking="random")
    assert torch.equal(generate(model, row, seed=11, **kw), generate(model, row, generator=torch.Generator().manual_seed(11), **kw))
