"""The study's fixed validation (docs/method.md §1, "Validation of a study"): same noise for every run,
unbiased against eq. 3-4 enumerated by brute force, and its standard error against a direct computation."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics

import pytest
import torch

from sinkdlm import DiffusionLM, ModelConfig
from sinkdlm.diffusion.likelihood import stratified_se, validation_elbo, validation_noise


def tiny_model(seed: int = 0, **kw) -> DiffusionLM:
    cfg = dict(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=64, max_position_embeddings=64, initializer_range=0.3, num_sink_tokens=1)
    torch.manual_seed(seed)
    return DiffusionLM(ModelConfig(**{**cfg, **kw})).double().eval()


X0 = torch.tensor([[3, 17, 5, 9, 21], [8, 2, 30, 11, 4]])


@torch.no_grad()
def brute_force_eq34(model, x0: torch.Tensor, first_maskable: int = 0) -> float:
    """Mean over rows of E_{t~U(0,1]} E_m[(1/(t M)) sum_{i in m} CE_i] (eq. 3-4 per token), every mask
    m enumerated: P(m|t)/t = t^{|m|-1} (1-t)^{M-|m|}, whose integral is the Beta function B(|m|, M-|m|+1)."""
    mask_id, shift = model.config.mask_token_id, model.config.shift_logits
    out = []
    for row in x0:
        positions = list(range(first_maskable, len(row)))
        m = len(positions)
        total = 0.0
        for k in range(1, m + 1):
            weight = math.gamma(k) * math.gamma(m - k + 1) / math.gamma(m + 1)
            for pattern in itertools.combinations(positions, k):
                xt = row.clone()
                xt[list(pattern)] = mask_id
                logp = torch.log_softmax(model(xt[None]).logits[0], -1)  # [L, V]
                total += weight * sum(-float(logp[i - 1 if shift else i, row[i]]) for i in pattern)
        out.append(total / m)
    return statistics.fmean(out)


@pytest.mark.parametrize("shift", [False, pytest.param(True, marks=pytest.mark.slow)])  # True: make test-slow
def test_unbiased_against_brute_force_eq34(shift):
    model = tiny_model(shift_logits=shift)
    want = brute_force_eq34(model, X0, first_maskable=1 if shift else 0)
    got = validation_elbo(model, X0, draws=4000, noise_seed=7, batch_size=4000)
    assert abs(got.val_loss - want) < 4 * got.val_loss_se, (got.val_loss, want, got.val_loss_se)
    assert got.val_loss_se < 0.01 * want  # and "closely": the test has power
    # the mean over many noise seeds of a small-draw estimate, too
    few = [validation_elbo(model, X0, draws=4, noise_seed=s, batch_size=8).val_loss for s in range(300)]
    se = statistics.stdev(few) / len(few) ** 0.5
    assert abs(statistics.fmean(few) - want) < 4 * se


def test_every_run_and_variant_sees_the_same_noise():
    """Two different models (vanilla, + 1 sink) and two calls: the masked inputs are identical."""
    seen = {}
    for name, model in (("vanilla", tiny_model(1, num_sink_tokens=0)), ("sink", tiny_model(2, num_sink_tokens=1))):
        inputs = []
        forward = model.forward
        model.forward = lambda xt, **kw: (inputs.append(xt.clone()), forward(xt, **kw))[1]
        validation_elbo(model, X0, draws=6, noise_seed=3, batch_size=5)
        seen[name] = torch.cat(inputs)
    assert torch.equal(seen["vanilla"], seen["sink"])
    assert torch.equal(validation_noise(2, 5, 6, 3), validation_noise(2, 5, 6, 3))
    assert not torch.equal(validation_noise(2, 5, 6, 3), validation_noise(2, 5, 6, 4))


def test_masked_counts_are_stratified():
    masked = validation_noise(50, 12, 6, noise_seed=0, first_maskable=1)  # [N, D, L]
    assert not masked[..., 0].any()
    count = masked.sum(-1)  # [N, D]; stratum d covers l in (d M / D, (d+1) M / D] + 1, M = 11
    for d in range(6):
        lo, hi = math.floor(d * 11 / 6) + 1, math.floor((d + 1) * 11 / 6) + 1
        assert ((count[:, d] >= lo) & (count[:, d] <= min(hi, 11))).all()


def test_se_matches_a_direct_computation_and_the_spread_over_noise_seeds():
    values = torch.rand(7, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    direct = 0.0
    for row in values.tolist():  # collapsed strata: (1/D^2) sum over pairs (v_2k - v_2k+1)^2, per row
        direct += sum((row[2 * k] - row[2 * k + 1]) ** 2 for k in range(4)) / 64
    assert stratified_se(values) == pytest.approx(math.sqrt(direct) / 7, rel=1e-12)
    # The estimate has the size of the real spread of the estimate over noise seeds (its root mean
    # square against the standard deviation over 200 seeds, whose own relative error is about 5 %).
    model = tiny_model()
    runs = [validation_elbo(model, X0, draws=8, noise_seed=s, batch_size=16) for s in range(200)]
    spread = statistics.stdev(r.val_loss for r in runs)
    se = statistics.fmean(r.val_loss_se**2 for r in runs) ** 0.5
    assert 0.8 * se < spread < 1.2 * se, (spread, se)


def test_bad_draws_are_one_line_errors():
    with pytest.raises(ValueError, match="even"):
        validation_noise(2, 5, 3, 0)
    with pytest.raises(ValueError, match="draws"):
        validation_noise(2, 5, 0, 0)


def test_a_slice_of_the_set_gets_the_noise_of_the_whole():
    model = tiny_model()
    x0 = torch.tensor([[3, 17, 5, 9, 21], [8, 2, 30, 11, 4], [1, 2, 3, 4, 5]])
    whole = validation_elbo(model, x0, draws=4, noise_seed=5)
    tail = validation_elbo(model, x0[1:], draws=4, noise_seed=5, first_sequence=1)
    assert torch.equal(whole.values[1:], tail.values)


def tiny_checkpoint(tmp_path, monkeypatch):
    """A one-layer DLM with a Shakespeare BPE tokenizer, saved as a checkpoint (the runner's validation loads it)."""
    from sinkdlm.data import load_documents, train_bpe_tokenizer

    monkeypatch.setenv("SINKDLM_CACHE", str(tmp_path / "cache"))
    tok = train_bpe_tokenizer(load_documents("shakespeare", "train")[:3], 300)  # 3 plays: 300 tokens, 1/10 the time of all 38
    torch.manual_seed(0)
    model = DiffusionLM(ModelConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    num_key_value_heads=1, intermediate_size=64, max_position_embeddings=64,
                                    mask_token_id=tok.mask_token_id))
    ckpt = tmp_path / "ckpt"
    model.save_pretrained(ckpt, tokenizer=tok)
    return ckpt


def test_an_interrupted_fixed_validation_resumes_where_it_stopped(tmp_path, monkeypatch):
    """units.fixed_validation keeps each chunk of sequences; killed after the first, a second call scores
    only the rest and ends with the numbers of an uninterrupted call."""
    import sinkdlm.diffusion.likelihood as likelihood
    from sinkdlm.experiment import units
    from sinkdlm.experiment.presets import Validation

    ckpt = tiny_checkpoint(tmp_path, monkeypatch)
    monkeypatch.setattr(units, "VAL_CHUNK", 2)
    kwargs = {"data": "shakespeare", "seq_len": 16, "max_tokens": 4000}
    val = Validation(tokens=96, draws=4, noise_seed=1)  # 6 sequences, 3 chunks
    want = units.fixed_validation(tmp_path / "whole", str(ckpt), kwargs, val)

    real, calls = likelihood.validation_elbo, []

    def dies_after_one_chunk(*a, **k):
        calls.append(k["first_sequence"])
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(likelihood, "validation_elbo", dies_after_one_chunk)
    with pytest.raises(KeyboardInterrupt):
        units.fixed_validation(tmp_path / "run", str(ckpt), kwargs, val)
    assert (tmp_path / "run" / units.VAL_PARTIAL).is_file() and not (tmp_path / "run" / units.VAL).exists()
    spent = json.loads((tmp_path / "run" / units.VAL_PARTIAL).read_text())["seconds"]
    calls.clear()
    monkeypatch.setattr(likelihood, "validation_elbo", lambda *a, **k: (calls.append(k["first_sequence"]), real(*a, **k))[1])
    got = units.fixed_validation(tmp_path / "run", str(ckpt), kwargs, val)
    assert calls == [2, 4]  # the first chunk was not scored again
    assert got["val_loss"] == pytest.approx(want["val_loss"], rel=1e-12)
    assert got["val_loss_se"] == pytest.approx(want["val_loss_se"], rel=1e-12)
    assert not (tmp_path / "run" / units.VAL_PARTIAL).exists()
    assert spent > 0 and got["seconds"] > spent  # the first call's scoring time is counted too


def test_a_bf16_study_scores_its_validation_under_autocast_and_never_pairs_it_with_fp32(tmp_path, monkeypatch):
    """`Validation(bf16=True)` (the `real-bf16` preset): every matmul of the scoring forward gets bf16
    operands (a dispatch spy), the values stay within bf16's rounding of the fp32 scoring, the record says
    so, and a study of the other precision refuses the stored record (a record without the key is fp32)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from sinkdlm.experiment import units
    from sinkdlm.experiment.presets import Validation, get_preset
    from sinkdlm.experiment.variance import same_validation

    ckpt = tiny_checkpoint(tmp_path, monkeypatch)
    kwargs = {"data": "shakespeare", "seq_len": 16, "max_tokens": 4000}
    fp32 = Validation(tokens=64, draws=4, noise_seed=1)
    bf16 = Validation(tokens=64, draws=4, noise_seed=1, bf16=True)

    class MatmulDtypes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm,
                                       torch.ops.aten.linear):
                self.seen |= {a.dtype for a in args if isinstance(a, torch.Tensor)}
            return func(*args, **(kwargs or {}))

    spies = {}
    for name, val in (("fp32", fp32), ("bf16", bf16)):
        with MatmulDtypes() as spy:
            rec = units.fixed_validation(tmp_path / name, str(ckpt), kwargs, val)
        spies[name] = (spy.seen, rec)
    assert spies["fp32"][0] == {torch.float32} and spies["bf16"][0] == {torch.bfloat16}
    a, b = (torch.tensor(spies[k][1]["values"]) for k in ("fp32", "bf16"))
    assert spies["bf16"][1]["bf16"] is True and spies["fp32"][1]["bf16"] is False
    assert not torch.equal(a, b) and torch.allclose(a, b, rtol=0.03, atol=0.03)  # bf16: 8 mantissa bits
    with pytest.raises(ValueError, match="bf16"):  # the other precision's record is not this study's
        units.fixed_validation(tmp_path / "bf16", str(ckpt), kwargs, fp32)
    assert same_validation({"draws": 4, "noise_seed": 1}, fp32) and not same_validation({"draws": 4, "noise_seed": 1}, bf16)
    real, real_bf16 = get_preset("real"), get_preset("real-bf16")  # `real`'s recipe in bf16, 3x the tokens (issue 40)
    assert real_bf16.train == dataclasses.replace(real.train, bf16=True, max_steps=3 * real.train.max_steps,
                                                  eval_every=300, save_every=100) and real_bf16.validation.bf16
    assert real_bf16.variants == real.variants and real_bf16.validation.checkpoints == (0.5,)
    assert set(real.seeds) < set(real_bf16.seeds) and len(real_bf16.seeds) >= 6  # the exact Wilcoxon can reject


@pytest.mark.parametrize("n,where", [(0, "front"), (1, "front"), (2, "end")])
def test_a_block_models_fixed_validation_is_the_block_nelbo_on_the_same_masks(n, where):
    """A block model is scored on the very masks a whole-sequence model gets, each block beside the clean blocks
    before it: every draw equals a computation written here (a whole-sequence twin on [x0 before the block, x_t
    of the block] under a block-causal mask of its own); with one block it is the whole-sequence model's value."""
    x0 = torch.randint(3, 40, (3, 8), generator=torch.Generator().manual_seed(5))
    model = tiny_model(num_sink_tokens=n, sink_position=where, block_size=4)
    twin = tiny_model(num_sink_tokens=n, sink_position=where)
    twin.load_state_dict(model.state_dict())
    got = validation_elbo(model, x0, draws=4, noise_seed=11, batch_size=5)
    masked = validation_noise(3, 8, 4, 11)
    mask_id = model.config.mask_token_id
    for i in range(3):
        for d in range(4):
            msk = masked[i, d]
            ce = []
            for lo in range(0, 8, 4):
                # the whole width (end sinks sit after it, as in the model's layout); later blocks are not seen
                x = torch.cat([x0[i, :lo], x0[i, lo:lo + 4].masked_fill(msk[lo:lo + 4], mask_id),
                               x0.new_full((8 - lo - 4,), mask_id)])[None]
                blocks = torch.arange(8) // 4
                logits = twin(x, attention_mask=(blocks[:, None] >= blocks[None, :])[None, None]).logits[0, lo:lo + 4]
                ce += torch.nn.functional.cross_entropy(logits, x0[i, lo:lo + 4], reduction="none")[msk[lo:lo + 4]].tolist()
            assert got.values[i, d].item() == pytest.approx(sum(ce) / len(ce), rel=1e-6)  # its CE in float32
    whole = tiny_model(num_sink_tokens=n, sink_position=where, block_size=8)
    whole.load_state_dict(model.state_dict())
    assert validation_elbo(whole, x0, draws=4, noise_seed=11).values == pytest.approx(
        validation_elbo(twin, x0, draws=4, noise_seed=11).values, rel=1e-6)
    with pytest.raises(ValueError, match="not a multiple of block_size=4"):
        validation_elbo(model, x0[:, :6], draws=4, noise_seed=11)
    shifted = tiny_model(num_sink_tokens=n, sink_position=where, block_size=4, shift_logits=True)  # Fast-dLLM v2's
    with pytest.raises(ValueError, match="shifted logits .* not written: .* loglikelihood"):
        validation_elbo(shifted, x0, draws=4, noise_seed=11)
