"""The escape probe's attention numbers (experiment/endpoints/escape/probe.py `Prober`, docs/method.md §11, §15)
against an independent computation on the very forwards it scores: a whole-sequence model's maps as they are, a
block model's x_t ⊕ x_0 maps folded here by hand (the x_t half's query rows, a position's noisy and clean key
columns added, the extra sinks' columns their own), sinks by Rulli et al. eq. 3 written out (detected on
the received sum, as `AnalyzeConfig.scale`; the masses are per query, the column mean)."""

from __future__ import annotations

import json

import pytest
import torch

from sinkdlm.diffusion.likelihood import validation_elbo
from sinkdlm.experiment.endpoints.escape.probe import Prober, unigram_plateau
from sinkdlm.experiment.presets import Escape
from sinkdlm.model.probe import Probe
from tests.helpers import tiny_model

LENGTH, N, DRAWS, EPSILON = 8, 3, 2, 3.0  # ϵ: the declared one (`Escape.epsilon`)


def _escape() -> Escape:
    return Escape(pair=("a", "b"), sequences=N, draws=DRAWS, noise_seed=5, epsilon=EPSILON)


def _x0() -> torch.Tensor:
    return torch.randint(3, 40, (N, LENGTH), generator=torch.Generator().manual_seed(11))  # [N, L]


def _probe(model, tmp_path, name: str) -> dict:
    x0 = _x0()
    path = tmp_path / f"{name}.json"
    Prober(path, x0, _escape(), unigram_plateau(x0, x0))(model, 7)
    return json.loads(path.read_text())["probes"]["7"]


def _fold(attn: torch.Tensor, n: int, position: str) -> torch.Tensor:
    """By hand: `[B, H, 2L+n, 2L+n]` -> `[B, H, L+n, L+n]` (sinks' rows and columns at their sequence places)."""
    length = (attn.shape[-1] - n) // 2
    front = position == "front"
    xt_row = [(n if front else 0) + i for i in range(length)]  # x_t's query rows
    noisy = [(n if front else 0) + i for i in range(length)]  # position i's two key columns
    clean = [(n if front else 0) + length + i for i in range(length)]
    sink = list(range(n)) if front else [2 * length + k for k in range(n)]
    size = length + n
    out = torch.zeros(*attn.shape[:2], size, size, dtype=attn.dtype)
    seq_sink = list(range(n)) if front else [length + k for k in range(n)]
    seq_content = [(n if front else 0) + i for i in range(length)]
    for i in range(length):
        for j in range(length):
            out[..., seq_content[i], seq_content[j]] = attn[..., xt_row[i], noisy[j]] + attn[..., xt_row[i], clean[j]]
        for k in range(n):
            out[..., seq_content[i], seq_sink[k]] = attn[..., xt_row[i], sink[k]]
    for k in range(n):  # a sink's own row (one-hot on itself), left out of the counted queries anyway
        out[..., seq_sink[k], seq_sink[k]] = attn[..., sink[k], sink[k]]
    return out


def _expected(model) -> dict:
    """The probe's numbers from this file's own hook on the same `validation_elbo` call."""
    cfg, e = model.config, _escape()
    n, front = cfg.num_sink_tokens, cfg.sink_position == "front"
    sink_keys = list(range(n)) if front else [LENGTH + k for k in range(n)]
    size = LENGTH + n
    content = torch.tensor([j not in sink_keys for j in range(size)])  # [S]
    maps: dict[int, list[torch.Tensor]] = {i: [] for i in range(cfg.num_hidden_layers)}

    def hook(layer, attn, values, virtual):
        maps[layer].append(attn.float())

    r = validation_elbo(model, _x0(), e.draws, e.noise_seed, batch_size=e.draws * max(1, 8 // e.draws),
                        probe=Probe(hook=hook))
    out = {"loss": r.val_loss, "token": [], "detected": [], "content": [], "moving": []}
    for layer in range(cfg.num_hidden_layers):
        attn = torch.cat(maps[layer])  # [N*D, H, S', S']
        if cfg.block_size is not None:
            assert attn.shape[-1] == 2 * LENGTH + n
            attn = _fold(attn, n, cfg.sink_position)
        assert attn.shape[-1] == size
        queries = attn[:, :, content, :]  # [B, H, L, S]: the content (x_t) query rows
        total = queries.sum(-2)  # received attention c_j [B, H, S], the column sum over the counted queries
        others = (total.sum(-1, keepdim=True) - total) / (size - 1)  # mean_{k != j} c_k
        sinks = total > others + e.epsilon  # Rulli et al. eq. 3 on the sum scale (the analysis's default), [B, H, S]
        c = total / queries.shape[-2]  # the masses: per query (the column mean)
        out["token"].append(float(c[..., sink_keys].sum(-1).mean()))
        out["detected"].append(float((c * sinks).sum(-1).mean()))
        out["content"].append(float((c * sinks)[..., content].sum(-1).mean()))
        sets = sinks[..., content].view(N, e.draws, cfg.num_attention_heads, LENGTH)  # draw d: stratum d
        changed = (sets[:, 1:] != sets[:, :-1]).any(-1)  # [N, D-1, H]: consecutive strata
        out["moving"].append(float(changed.float().mean()))
    return out


def _check(got: dict, want: dict, has_sink: bool) -> None:
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-12)
    if has_sink:
        assert got["sink_token_mass"] == pytest.approx(want["token"], abs=1e-6)
    else:
        assert got["sink_token_mass"] is None
    assert got["detected_sink_mass"] == pytest.approx(want["detected"], abs=1e-6)
    assert got["content_sink_mass"] == pytest.approx(want["content"], abs=1e-6)
    assert got["content_sink_set_change_rate"] == pytest.approx(want["moving"], abs=1e-12)


@pytest.mark.parametrize("kw", [{}, {"num_sink_tokens": 1}, {"num_sink_tokens": 2, "sink_position": "end"}])
def test_whole_sequence_probe_against_a_direct_computation(tmp_path, kw):
    model = tiny_model(3, **kw)
    want = _expected(model)
    assert 0 < max(want["detected"]) and 0 < max(want["moving"]) < 1  # the check sees sinks, and sets that move
    _check(_probe(model, tmp_path, "whole"), want, bool(kw))


@pytest.mark.parametrize("kw", [{"block_size": 2}, {"block_size": 2, "num_sink_tokens": 1},
                                {"block_size": 4, "num_sink_tokens": 2, "sink_position": "end"}])
def test_block_probe_reads_the_xt_queries_with_both_copies_of_a_key_as_one(tmp_path, kw):
    model = tiny_model(3, **kw)
    want = _expected(model)
    assert 0 < max(want["detected"]) and 0 < max(want["moving"]) < 1
    got = _probe(model, tmp_path, "block")
    _check(got, want, "num_sink_tokens" in kw)
    if "num_sink_tokens" in kw:  # the folded rows put all their mass on the sequence's keys: tokens and sinks
        assert all(0 < m < 1 for m in got["sink_token_mass"])


@pytest.mark.parametrize("kw", [{}, {"num_sink_tokens": 1}, {"num_sink_tokens": 1, "sink_position": "end"}])
def test_one_block_as_long_as_the_sequence_probes_as_the_whole_sequence_model(tmp_path, kw):
    whole = tiny_model(4, **kw)
    block = tiny_model(4, block_size=LENGTH, **kw)
    block.load_state_dict(whole.state_dict())  # the same weights; only the pass differs (x_t ⊕ x_0, one block)
    a, b = _probe(whole, tmp_path, "whole"), _probe(block, tmp_path, "block")
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-9)
    for key in ("sink_token_mass", "detected_sink_mass", "content_sink_mass"):
        assert (a[key] is None) == (b[key] is None)
        if a[key] is not None:
            assert b[key] == pytest.approx(a[key], abs=1e-6)
    assert b["content_sink_set_change_rate"] == a["content_sink_set_change_rate"]


def test_a_block_run_of_a_study_with_the_escape_endpoint_records_its_probes(tmp_path):
    """The endpoint's own path (`Escape.probe`, as `experiment/stages.py` hands it to the trainer) on a block arm
    with a sink: every probe is recorded over the sequence's layout, and the run's escape record reads them."""
    from types import SimpleNamespace

    from sinkdlm.config import TrainConfig
    from sinkdlm.experiment.endpoints.escape import Escape as EscapeEndpoint
    from sinkdlm.experiment.endpoints.escape.probe import escape_record
    from sinkdlm.experiment.presets import MICRO
    from sinkdlm.training import train
    from sinkdlm.training.rundir import read_metrics

    kwargs = dict(preset="tiny", model_overrides=MICRO, data="shakespeare", max_steps=4, batch_size=4, seq_len=32,
                  max_tokens=20_000, eval_every=4, save_every=4, log_every=1, eval_batches=1, lr=1e-3,
                  num_sink_tokens=1, block_size=4, out=str(tmp_path / "run" / "train"))
    escape = Escape(pair=("a", "b"), every=2, sequences=2, draws=2)
    preset = SimpleNamespace(escape=escape)
    every, prober = EscapeEndpoint().probe(preset, tmp_path / "run", kwargs)
    train(TrainConfig(**kwargs), probe=(every, prober))
    probes = json.loads((tmp_path / "run" / "escape" / "probes.json").read_text())["probes"]
    assert sorted(probes, key=int) == ["2", "4"]
    for p in probes.values():
        for key in ("sink_token_mass", "detected_sink_mass", "content_sink_mass", "content_sink_set_change_rate"):
            assert len(p[key]) == MICRO["num_hidden_layers"] and all(0 <= v <= 1 for v in p[key])
        assert all(0 < m < 1 for m in p["sink_token_mass"])
    record = escape_record(tmp_path / "run" / "escape" / "probes.json", read_metrics(tmp_path / "run" / "train"), escape)
    assert [s for s, _ in record["curve"]] == [2, 4]
