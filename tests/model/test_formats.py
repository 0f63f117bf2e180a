"""Pretrained layouts opened directly (`sinkdlm.model.formats`, docs/method.md §10).

Tiny random checkpoints are written here with the real key names and config fields:
  * LLaDA: OLMo-style names, LLaDA config.json, sharded safetensors with an index; its logits are
    compared with an eager float64 implementation of LLaDA's forward written below (RMSNorm, the
    half-split rotary, `act(ff_proj x) * up_proj x`, untied `ff_out` head, no mask);
  * Dream: a `Qwen2ForCausalLM` saved with `model_type: "Dream"`; its shifted logits are compared
    with HF `Qwen2Model` run bidirectionally (explicit 4-D zero mask) + its head, shifted;
  * autoregressive Qwen2 / LLaMA: loaded as causal, compared with `Qwen2ForCausalLM` /
    `LlamaForCausalLM` logits, greedy decoding and exact log-likelihood.
Each checkpoint carries an `auto_map` to Python files that would leave a marker when imported.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from sinkdlm import DiffusionLM
from sinkdlm.analysis.comparison import compare
from sinkdlm.analysis.analyzer import analyze
from sinkdlm.data.tokenizer import train_bpe_tokenizer
from sinkdlm.diffusion.likelihood import loglikelihood
from sinkdlm.diffusion.loss import diffusion_loss
from sinkdlm.diffusion.noise import MaskNoise
from sinkdlm.diffusion.sampling import StepProbe, generate
from sinkdlm.io.files import CheckpointError
from sinkdlm.checkpoint.manager import load_model_and_tokenizer
from sinkdlm.config import AnalyzeConfig, EvalConfig, SampleConfig

V = 320  # model vocabulary (the BPE below has at most 300 tokens: padded rows, as in real models)
TEXTS = ["the quick brown fox jumps over the lazy dog, and the cat sleeps. " * 30,
         "to be or not to be: that is the question; whether tis nobler. " * 30]
EVIL = "import pathlib\npathlib.Path(__file__).with_name('EXECUTED').write_text('x')\nraise SystemExit('ran')\n"

from numerics import assert_model_close, fp_tolerance, model_reduction


@pytest.fixture(scope="module")
def tok():
    return train_bpe_tokenizer(TEXTS, 300)  # <|endoftext|> 0, <|pad|> 1, [MASK] 2


def rand(gen, *shape, scale=0.2):
    return scale * torch.randn(*shape, generator=gen)


def add_remote_code(path, tok, *, drop_mask_role=False):
    """auto_map entries pointing at Python files that must never run; tokenizer roles edited."""
    for name in ("modeling_evil.py", "configuration_evil.py", "tokenization_evil.py"):
        (path / name).write_text(EVIL)
    tok.save_pretrained(str(path))
    tc = json.loads((path / "tokenizer_config.json").read_text())
    tc["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    tc["tokenizer_class"] = "EvilTokenizer"
    if drop_mask_role:  # LLaDA's tokenizer does not name its mask token: the loader maps it by id
        tc.pop("mask_token", None)
        stm = path / "special_tokens_map.json"
        if stm.is_file():
            m = json.loads(stm.read_text())
            m.pop("mask_token", None)
            stm.write_text(json.dumps(m))
    (path / "tokenizer_config.json").write_text(json.dumps(tc))


# ----------------------------------------------------------------------------- LLaDA
LLADA = dict(d=32, heads=4, kv=2, layers=2, mlp=48, theta=5000.0, eps=1e-5)


def write_llada(path, tok, *, qkv_bias=True, **config_changes):
    c = LLADA
    gen = torch.Generator().manual_seed(5)
    hd = c["d"] // c["heads"]
    t = {"model.transformer.wte.weight": rand(gen, V, c["d"], scale=1.0),
         "model.transformer.ln_f.weight": 1 + rand(gen, c["d"]),
         "model.transformer.ff_out.weight": rand(gen, V, c["d"])}
    for i in range(c["layers"]):
        p = f"model.transformer.blocks.{i}."
        t.update({p + "attn_norm.weight": 1 + rand(gen, c["d"]), p + "ff_norm.weight": 1 + rand(gen, c["d"]),
                  p + "q_proj.weight": rand(gen, c["d"], c["d"]), p + "k_proj.weight": rand(gen, c["kv"] * hd, c["d"]),
                  p + "v_proj.weight": rand(gen, c["kv"] * hd, c["d"]), p + "attn_out.weight": rand(gen, c["d"], c["d"]),
                  p + "ff_proj.weight": rand(gen, c["mlp"], c["d"]), p + "up_proj.weight": rand(gen, c["mlp"], c["d"]),
                  p + "ff_out.weight": rand(gen, c["d"], c["mlp"])})
        if qkv_bias:
            t.update({p + "q_proj.bias": rand(gen, c["d"]), p + "k_proj.bias": rand(gen, c["kv"] * hd),
                      p + "v_proj.bias": rand(gen, c["kv"] * hd)})
    path.mkdir(parents=True, exist_ok=True)
    keys = sorted(t)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, ks in shards.items():
        save_file({k: t[k] for k in ks}, str(path / name), metadata={"format": "pt"})
    index = {"metadata": {"total_size": 0}, "weight_map": {k: n for n, ks in shards.items() for k in ks}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {
        "model_type": "llada", "architectures": ["LLaDAModelLM"],
        "auto_map": {"AutoConfig": "configuration_evil.LLaDAConfig", "AutoModel": "modeling_evil.LLaDAModelLM"},
        "d_model": c["d"], "n_heads": c["heads"], "n_kv_heads": c["kv"], "n_layers": c["layers"],
        "mlp_hidden_size": c["mlp"], "mlp_ratio": 4, "rope_theta": c["theta"], "rms_norm_eps": c["eps"],
        "include_bias": False, "include_qkv_bias": qkv_bias, "embedding_size": V, "vocab_size": len(tok),
        "mask_token_id": tok.mask_token_id, "block_type": "llama", "weight_tying": False,
        "max_sequence_length": 128, "layer_norm_type": "rms", "activation_type": "silu", "rope": True,
        "alibi": False, "scale_logits": False, "attention_layer_norm": False, "block_group_size": 1,
        "input_emb_norm": False, "multi_query_attention": None, "rope_full_precision": True, "pad_token_id": 1,
        "eos_token_id": 0, "torch_dtype": "float32",
    }
    config.update(config_changes)
    (path / "config.json").write_text(json.dumps(config))
    add_remote_code(path, tok, drop_mask_role=True)
    return t


def llada_reference(t, ids):
    """LLaDA's forward written out from its published modeling code, in float64."""
    c = LLADA
    w = {k: v.double() for k, v in t.items()}
    b, n = ids.shape
    hd = c["d"] // c["heads"]

    def rms(x, weight):
        return weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + c["eps"]))

    inv = 1.0 / c["theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rope(x):  # x [B, h, n, hd]: OLMo's rotate_half views the head as (2, hd/2) halves
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def proj(x, name, heads):
        y = x @ w[name + ".weight"].T + (w[name + ".bias"] if name + ".bias" in w else 0)
        return y.view(b, n, heads, hd).transpose(1, 2)

    x = w["model.transformer.wte.weight"][ids]
    for i in range(c["layers"]):
        p = f"model.transformer.blocks.{i}."
        h = rms(x, w[p + "attn_norm.weight"])
        q = rope(proj(h, p + "q_proj", c["heads"]))
        k = rope(proj(h, p + "k_proj", c["kv"])).repeat_interleave(c["heads"] // c["kv"], 1)
        v = proj(h, p + "v_proj", c["kv"]).repeat_interleave(c["heads"] // c["kv"], 1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), -1) @ v  # bidirectional: no mask
        x = x + att.transpose(1, 2).reshape(b, n, -1) @ w[p + "attn_out.weight"].T
        h = rms(x, w[p + "ff_norm.weight"])
        x = x + (F.silu(h @ w[p + "ff_proj.weight"].T) * (h @ w[p + "up_proj.weight"].T)) @ w[p + "ff_out.weight"].T
    return rms(x, w["model.transformer.ln_f.weight"]) @ w["model.transformer.ff_out.weight"].T


@pytest.fixture(scope="module")
def llada_dir(tmp_path_factory, tok):
    path = tmp_path_factory.mktemp("llada")
    return path, write_llada(path, tok)


def ids(b=2, n=9, seed=1):
    return torch.randint(3, 290, (b, n), generator=torch.Generator().manual_seed(seed))


def test_llada_logits_equal_an_eager_reference(llada_dir, tok):
    path, tensors = llada_dir
    model, tokenizer = load_model_and_tokenizer(path, device="cpu", dtype="float64")
    cfg = model.config
    assert (cfg.vocab_size, cfg.mask_token_id, cfg.shift_logits, cfg.causal) == (V, tok.mask_token_id, False, False)
    assert not cfg.tie_word_embeddings and cfg.qkv_bias and cfg.num_key_value_heads == 2
    assert tokenizer.mask_token_id == tok.mask_token_id  # mapped from config.mask_token_id
    x = ids()
    with torch.no_grad():
        ours = model(x).logits
    # RMSNorm statistics and rotary angles are computed in fp32 (as LLaDA does), hence fp32-level agreement
    assert_model_close(ours, llada_reference(tensors, x), cfg, dtype=torch.float32)
    assert not (path / "EXECUTED").exists()  # auto_map code never imported


def test_llada_generate_loglikelihood_loss_and_bf16(llada_dir, tok):
    path, _ = llada_dir
    model = DiffusionLM.from_pretrained(path)
    out = generate(model, [5, 6, 7], gen_length=4, steps=4)
    assert out.shape == (1, 7) and not (out == tok.mask_token_id).any()
    ll = loglikelihood(model, [5, 6, 7], [8, 9], mc_num=4, seed=0)
    assert math.isfinite(float(ll.logprob)) and float(ll.logprob) < 0
    with torch.no_grad():
        assert math.isfinite(float(diffusion_loss(model, ids(), MaskNoise(generator=torch.Generator().manual_seed(0))).loss))
    bf16 = DiffusionLM.from_pretrained(path, dtype="bfloat16")
    assert bf16.dtype == torch.bfloat16 and bf16(ids()).logits.shape == (2, 9, V)


# ----------------------------------------------------------------------------- HF-built checkpoints
def hf_causal(arch, vocab=V):
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rope_theta=5000.0, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, attn_implementation="eager", bos_token_id=0, eos_token_id=0)
    model = (Qwen2ForCausalLM(Qwen2Config(**common)) if arch == "qwen2" else LlamaForCausalLM(LlamaConfig(**common)))
    gen = torch.Generator().manual_seed(11 + (arch == "llama"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + rand(gen, *p.shape) if "norm" in name else rand(gen, *p.shape, scale=0.3))
    return model.eval()


def save_hf(model, path, tok, **config_changes):
    model.save_pretrained(str(path), max_shard_size="40KB")  # sharded, with an index
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(config_changes, auto_map={"AutoModel": "modeling_evil.EvilModel"})
    (path / "config.json").write_text(json.dumps(cfg))
    add_remote_code(path, tok)
    return path


@pytest.fixture(scope="module")
def dream(tmp_path_factory, tok):
    hf = hf_causal("qwen2")
    path = save_hf(hf, tmp_path_factory.mktemp("dream"), tok, model_type="Dream",
                   architectures=["DreamModel"], mask_token_id=tok.mask_token_id)
    return hf, path


def test_dream_shifted_logits_equal_bidirectional_qwen2(dream, tok):
    hf, path = dream
    assert len(list(path.glob("model-*.safetensors"))) > 1
    model, tokenizer = load_model_and_tokenizer(path, device="cpu")
    assert model.config.shift_logits and not model.config.causal and model.config.qkv_bias
    assert tokenizer.mask_token_id == model.config.mask_token_id == tok.mask_token_id
    x = ids()
    with torch.no_grad():
        zero = torch.zeros(2, 1, 9, 9)  # an explicit 4-D additive mask of zeros: nothing is causal
        ref = hf.lm_head(hf.model(input_ids=x, attention_mask=zero).last_hidden_state)
        ours = model(x).logits
    shift = lambda z: torch.cat([z[:, :1], z[:, :-1]], 1)  # noqa: E731  (Dream: row i predicts token i+1)
    assert_model_close(shift(ours), shift(ref), model.config)  # transformers' kernels
    # the sampler reads the shift from the model: the default equals an explicit shift_logits=True
    a = generate(model, [5, 6, 7], gen_length=4, steps=4)
    assert torch.equal(a, generate(model, [5, 6, 7], gen_length=4, steps=4, shift_logits=True))  # same path
    ll = loglikelihood(model, [5, 6], [7], mc_num=2, seed=0, method="mc_count")
    with torch.no_grad():  # one-token answer: exact; scored by the logits of the previous position
        masked = model(torch.tensor([[5, 6, tok.mask_token_id]])).logits[0, 1].double()
    want = float(torch.log_softmax(masked, -1)[7])  # a float32 model in another batch shape: rule 2, not 1e-6
    tol = fp_tolerance(torch.float32, **model_reduction(model.config), scale=abs(want))
    assert float(ll.logprob) == pytest.approx(want, abs=tol["atol"])
    assert not (path / "EXECUTED").exists()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_autoregressive_checkpoints_load_as_causal(tmp_path, tok, arch):
    hf = hf_causal(arch)
    path = save_hf(hf, tmp_path / arch, tok)
    model, tokenizer = load_model_and_tokenizer(path, device="cpu")
    assert model.config.causal and model.config.shift_logits and model.config.mask_token_id is None
    assert model.config.qkv_bias == (arch == "qwen2")
    x = ids()
    with torch.no_grad():
        ref = hf(input_ids=x).logits
        assert_model_close(model(x).logits, ref, model.config)  # transformers' kernels
        # greedy decoding: the HF model's argmax, one token at a time; token parity across two
        # implementations in float64, where no argmax gap is within rounding (tests/numerics.py)
        model, hf = model.double(), hf.double()
        seq = torch.tensor([[5, 6, 7]])
        for _ in range(4):
            seq = torch.cat([seq, hf(input_ids=seq).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(generate(model, [5, 6, 7], gen_length=4, steps=4), seq)
    # exact log-likelihood: sum of the next-token log-probabilities of the continuation
    ll = loglikelihood(model, [5, 6, 7], [8, 9])
    with torch.no_grad():
        lp = torch.log_softmax(hf(input_ids=torch.tensor([[5, 6, 7, 8, 9]])).logits[0].double(), -1)
    assert ll.method == "exact" and float(ll.stderr) == 0
    assert float(ll.logprob) == pytest.approx(float(lp[2, 8] + lp[3, 9]), abs=1e-5)  # float64, HF's fp32 rotary angles: 2e-7 here, rule 2 at fp32 allows ~1e-4
    assert not (path / "EXECUTED").exists()


# ----------------------------------------------------------------------------- analysis
def test_analyze_dlm_and_ar_and_compare(tmp_path, llada_dir, dream, tok, monkeypatch):
    import sinkdlm.analysis.figures as figures

    # Rendering PNGs is most of the time here and is tested elsewhere (test_analysis_figures.py).
    monkeypatch.setattr(figures, "save_figure", lambda fig, path, **kw: path.write_bytes(b"") or path)
    prompts = ["the quick brown fox jumps over", "to be or not to be, that is"]
    dlm = DiffusionLM.from_pretrained(llada_dir[0])
    a = analyze(dlm, tok, prompts, AnalyzeConfig(sample=SampleConfig(gen_length=4, steps=4), ablation_k=[1, 5],
                                                 out=tmp_path / "dlm", mc_num=2, quiet=True, label="llada"))
    assert a["model"]["kind"].startswith("diffusion") and a["model"]["source_format"] == "llada"
    d = analyze(DiffusionLM.from_pretrained(dream[1]), tok, prompts,
                AnalyzeConfig(sample=SampleConfig(gen_length=4, steps=4), out=tmp_path / "dream", quiet=True))
    assert d["model"]["shift_logits"] and d["model"]["source_format"] == "dream" and d["setup"]["steps_taken"] == 4
    ar_dir = save_hf(hf_causal("qwen2"), tmp_path / "ar", tok)
    ar, _ = load_model_and_tokenizer(ar_dir, device="cpu")
    b = analyze(ar, tok, prompts, AnalyzeConfig(sample=SampleConfig(gen_length=4), ablation_k=[1, 5],
                                                out=tmp_path / "ar", quiet=True, label="qwen2"))
    assert b["model"]["causal"] and b["setup"]["steps_taken"] == 4  # one step per generated token
    assert b["ablation"]["metric"] == "continuation_logprob_per_token" and set(b["ablation"]["scores"]) == {"0", "1", "5"}
    assert 0 <= b["non_sink_fraction"] <= 1 and len(b["sink_attention_mass"]) == 2
    result = compare([tmp_path / "dlm", tmp_path / "ar"], tmp_path / "cmp")
    assert "ablation_curve" in result["figures"]
    report = (tmp_path / "cmp" / "report.md").read_text()
    assert "autoregressive (causal)" in report and "Masking curve" in report


def test_ar_generation_recorder_sees_growing_causal_maps(tmp_path, tok):
    from sinkdlm.analysis.recorder import SinkRecorder

    model, _ = load_model_and_tokenizer(save_hf(hf_causal("llama"), tmp_path / "ar", tok), device="cpu")
    seen = []
    rec = SinkRecorder(model.config, AnalyzeConfig(epsilon=0.5))

    def hook_fn(step, input_ids, mask):
        record = rec.step_hook(step, input_ids, mask)

        def hook(layer, attn, values, column):
            seen.append(attn.shape[-1])
            assert torch.all(attn.triu(1) == 0)  # causal: no query attends to a later key
            record(layer, attn, values, column)
        return hook

    generate(model, [[5, 6, 7], [8, 9]], gen_length=3, steps=3, probe=StepProbe(hook=hook_fn))
    assert seen == [3, 3, 4, 4, 5, 5]  # two layers per step, one more key each step
    summary = rec.summary()
    assert summary["counts"]["steps"] == 3 and rec.figure_maps()[0].shape[-1] == 5


# ----------------------------------------------------------------------------- training from them
@pytest.mark.parametrize("which", ["llada", "dream", "qwen2"])
def test_train_init_from_and_sft_accept_them(tmp_path, tok, llada_dir, dream, which):
    from sinkdlm.training import TrainConfig, train

    src = {"llada": llada_dir[0], "dream": dream[1]}.get(which)
    if src is None:
        src = save_hf(hf_causal("qwen2"), tmp_path / "qwen2", tok)
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(TEXTS))
    common = dict(max_steps=1, batch_size=2, seq_len=16, save_every=1, eval_every=1, eval_batches=1,
                  tensorboard=False, cache_dir=str(tmp_path / "cache"))
    run = train(TrainConfig.resolve(out=str(tmp_path / "run"), data=str(corpus), init_from=str(src), **common))
    trained = DiffusionLM.from_pretrained(run["checkpoint"])
    assert not trained.config.causal and trained.config.shift_logits == (which == "dream")
    if which == "qwen2":  # converted on load: a [MASK] row was added
        assert trained.config.mask_token_id is not None
    pairs = tmp_path / "sft.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"the fox {i} jumps", "response": " over the dog."}) + "\n"
                             for i in range(24)))
    sft = train(TrainConfig.resolve(out=str(tmp_path / "sft"), data=str(pairs), init_from=str(src), sft=True,
                                    **{**common, "seq_len": 32}))
    assert math.isfinite(sft["last"]["val_loss"])


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "change,match",
    [
        (dict(model_type="gpt2"), "model_type 'gpt2' is not supported"),
        (dict(mask_token_id=None), "mask_token_id"),
        (dict(block_type="sequential"), "block_type"),
        (dict(scale_logits=True), "scale_logits"),
    ],
)
def test_llada_bad_configs_are_refused(tmp_path, tok, change, match):
    write_llada(tmp_path, tok, **change)
    if change.get("mask_token_id", 0) is None:
        cfg = json.loads((tmp_path / "config.json").read_text())
        del cfg["mask_token_id"]
        (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=match):
        DiffusionLM.from_pretrained(tmp_path)


def test_dream_without_mask_token_id_and_ar_loss_are_refused(tmp_path, tok):
    path = save_hf(hf_causal("qwen2"), tmp_path / "d", tok, model_type="Dream")
    with pytest.raises(CheckpointError, match="mask_token_id.*151666"):
        DiffusionLM.from_pretrained(path)
    ar = DiffusionLM.from_pretrained(save_hf(hf_causal("qwen2"), tmp_path / "ar", tok))
    with pytest.raises(ValueError, match="autoregressive"):
        diffusion_loss(ar, ids())
    with pytest.raises(ValueError, match="autoregressive"):
        generate(ar, [5, 6], gen_length=4, steps=4, threshold=0.9)


def test_cli_generate_and_analyze_an_ar_directory(tmp_path, tok, monkeypatch):
    import sinkdlm.analysis.figures as figures
    import sinkdlm.cli  # noqa: F401  (registers the commands)
    from typer.testing import CliRunner

    from sinkdlm.cli import app

    monkeypatch.setattr(figures, "save_figure", lambda fig, path, **kw: path.write_bytes(b"") or path)
    path = save_hf(hf_causal("llama"), tmp_path / "ar", tok)
    out = CliRunner().invoke(app, ["generate", "--model", str(path), "--prompt", "the quick brown fox",
                                   "--gen-length", "3", "--device", "cpu", "--json"])
    assert out.exit_code == 0, out.output
    assert len(json.loads(out.stdout)["tokens"]) == 3
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the quick brown fox jumps over\nto be or not to be, that is\n")
    out = CliRunner().invoke(app, ["analyze", "--model", str(path), "--prompts", str(prompts), "--gen-length", "3",
                                   "--steps", "3", "--ablation-k", "1", "--device", "cpu", "--quiet",
                                   "--out", str(tmp_path / "an")])
    assert out.exit_code == 0, out.output
    a = json.loads((tmp_path / "an" / "analysis.json").read_text())
    assert a["model"]["kind"] == "autoregressive (causal)" and a["ablation"]["k"] == [0, 1]


@pytest.mark.parametrize("which", ["dream", "qwen2"])
def test_eval_and_lm_eval_model_open_them(tmp_path, tok, dream, which):
    from sinkdlm.evaluation.evaluator import evaluate_dir

    path = dream[1] if which == "dream" else save_hf(hf_causal("qwen2"), tmp_path / "ar", tok)
    scores = evaluate_dir(EvalConfig(tasks="shakespeare_cloze", model=path, device="cpu", limit=2, mc_num=2, gen_steps=2))
    assert 0 <= scores["shakespeare_cloze"]["acc"]["value"] <= 1
    pytest.importorskip("lm_eval", reason="the lm-eval model needs the optional lm-eval (pip install 'sinkdlm[eval]')")
    lm_eval_model = pytest.importorskip("sinkdlm.evaluation.lm_eval_model")
    from lm_eval.api.instance import Instance

    lm = lm_eval_model.SinkDLMEvalModel.create_from_arg_obj(dict(pretrained=str(path), mc_num=2, device="cpu"))
    assert lm.model.config.shift_logits  # read from the checkpoint, not from a model_arg
    req = Instance(request_type="loglikelihood", doc={}, arguments=("the quick brown", " fox"), idx=0)
    (logprob, _), = lm.loglikelihood([req], disable_tqdm=True)
    assert math.isfinite(logprob) and logprob < 0
