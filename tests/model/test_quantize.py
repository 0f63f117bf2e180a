"""`--quantize` (model/quantize.py): torchao's int8 schemes on a tiny model, against references written here.

* Each quantized linear's output is within the bound the int8 steps give, on the inputs the model feeds it:
  with ŵ = w + δ, |δ| <= s_w / 2 (s_w = max|w_row| / 127, a bound on torchao's max/127.5) and, W8A8, the
  activation row x̂ = x + ε, |ε| <= a / 2 (a = max|x_row| / 127):
      |ŵ·x̂ - w·x| <= s_w/2 ‖x‖₁ + a/2 ‖w‖₁ + s_w a / 4 · d        (the last two terms: W8A8 only),
  plus the float rounding of rule 2 (tests/numerics.py).
* int8-weight: the quantized model's logits are those of a float model holding the dequantized weights
  (q · s read from torchao's tensors, each within s/2 of the original), to rule 2.
* What is kept in its own dtype is bitwise untouched: the sink rows, embeddings, norms, sink logits, head.
* A quantized model refuses training, and the refusals come in one line before any weight is read.
"""

from __future__ import annotations

import copy
import io
from contextlib import redirect_stderr, redirect_stdout

import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_model
from numerics import assert_model_close, fp_tolerance
from sinkdlm.model.quantize import check_quantize, quantize_model, quantized_linears, torchao_version

needs_torchao = pytest.mark.skipif(torchao_version() is None, reason="torchao is not installed (pip install 'sinkdlm[quant]')")

INT8 = ("int8-weight", "int8-dynamic")


def _model(**kw):
    """A float32 tiny model (torchao's int8 tensors take float32/bfloat16), with a sink, a virtual sink column and
    a head of its own (untied)."""
    return tiny_model(num_sink_tokens=1, initializer_range=0.05, sink_logit=True, hidden_size=64,
                      intermediate_size=128, tie_word_embeddings=False, **kw).float()


def _ids(model, b=2, l=10, seed=0):
    return torch.randint(0, model.config.vocab_size - 1, (b, l), generator=torch.Generator().manual_seed(seed))


@needs_torchao
@pytest.mark.parametrize("scheme", INT8)
def test_kept_parts_are_bitwise_untouched_and_the_block_linears_quantized(scheme):
    model = _model()
    kept = {name: p.detach().clone() for name, p in model.named_parameters()
            if not any(name == f"{lin}.weight" for lin in quantized_linears(model))}
    assert "sink_embeddings" in kept and "lm_head.weight" in kept and "norm.weight" in kept
    quantize_model(model, scheme)
    params = dict(model.named_parameters())
    for name, before in kept.items():
        assert type(params[name].data) is torch.Tensor, name
        assert torch.equal(params[name], before), name  # the same tensor, never touched
    for lin in quantized_linears(model):
        assert type(model.get_submodule(lin).weight.data) is not torch.Tensor, lin  # torchao's int8 tensor
    assert model.quantization == scheme


CUDA = pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                          reason="needs a CUDA GPU")])


@needs_torchao
@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("scheme", INT8)
def test_each_quantized_linear_is_within_its_int8_step_bound(scheme, device):
    model = _model().to(device)
    weights = {name: model.get_submodule(name).weight.detach().clone() for name in quantized_linears(model)}
    quantize_model(model, scheme)
    seen = []

    def hook(name):
        def record(module, args, out):
            seen.append((name, args[0].detach(), out.detach()))
        return record

    handles = [model.get_submodule(n).register_forward_hook(hook(n)) for n in weights]
    with torch.no_grad():
        model(_ids(model).to(device))
    for h in handles:
        h.remove()
    assert {n for n, _, _ in seen} == set(weights)
    for name, x, y in seen:
        w = weights[name]  # [out, d]
        want = F.linear(x, w)
        x64, w64 = x.double().abs(), w.double().abs()
        s_w = w64.amax(-1) / 127  # [out]
        bound = s_w / 2 * x64.sum(-1, keepdim=True)  # [..., out]
        if scheme == "int8-dynamic":
            a = x64.amax(-1, keepdim=True) / 127  # [..., 1] one scale per token
            bound = bound + a / 2 * w64.sum(-1) + s_w * a / 4 * w.shape[1]
        tol = fp_tolerance(torch.float32, n=w.shape[1], scale=float(want.abs().max()))
        excess = (y.double() - want.double()).abs() - bound - tol["atol"] - tol["rtol"] * want.double().abs()
        assert excess.max() <= 0, f"{name}: above the int8 step bound by {excess.max():.3g}"


@needs_torchao
def test_int8_weight_logits_are_the_dequantized_models():
    model = _model()
    reference = copy.deepcopy(model)
    quantize_model(model, "int8-weight")
    with torch.no_grad():
        for name in quantized_linears(model):
            qw = model.get_submodule(name).weight
            w = reference.get_submodule(name).weight
            step = qw.scale.reshape(-1, 1)  # [out, 1]
            assert bool((step <= w.abs().amax(-1, keepdim=True) / 127).all())
            dequantized = qw.qdata.float() * step
            # half a step at most, and the float32 rounding of q · s (the largest |w| lands on the clamp's edge)
            slack = 4 * torch.finfo(torch.float32).eps * w.abs()
            assert bool(((dequantized - w).abs() <= step / 2 + slack).all()), name
            w.copy_(dequantized)
        ids = _ids(model)
        got, want = model(ids).logits, reference(ids).logits
    assert_model_close(got, want, model.config)


@needs_torchao
@pytest.mark.parametrize("scheme", INT8)
def test_a_quantized_model_generates_and_refuses_training(scheme):
    from sinkdlm import generate

    model = quantize_model(_model(), scheme)
    out = generate(model, _ids(model, b=1, l=4), gen_length=8, steps=8, block_length=4, cache="dual")
    assert out.shape == (1, 12)
    model.eval()  # eval stays allowed
    with pytest.raises(ValueError, match="quantization is for inference here") as err:
        model.train()
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="quantized already"):
        quantize_model(model, scheme)


@needs_torchao
def test_refusals_in_one_line():
    cpu = torch.device("cpu")
    for scheme, words in [("int3", "--quantize must be one of int8-weight | int8-dynamic | int4-weight"),
                          ("int4-weight", "has no torchao kernel on cpu")]:
        with pytest.raises(ValueError, match=words) as err:
            check_quantize(scheme, cpu)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="drop --dtype float64"):
        check_quantize("int8-weight", cpu, "float64")
    with pytest.raises(ValueError, match="load it with --dtype float32"):
        quantize_model(tiny_model(), "int8-weight")  # a float64 model


@needs_torchao
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="int4-weight runs torchao's tinygemm kernel, CUDA only")
def test_int4_weight_on_cuda_is_within_its_step_bound():
    model = _model().to("cuda", torch.bfloat16)
    ids = _ids(model).cuda()
    if torch.cuda.get_device_capability()[0] < 8:
        with pytest.raises(ValueError, match="compute capability"):
            check_quantize("int4-weight", model.device, "bfloat16")
        return
    with pytest.raises(ValueError, match="add --dtype bfloat16"):
        check_quantize("int4-weight", model.device, None)
    with torch.no_grad():
        want = model(ids).logits.float()
        got = quantize_model(model, "int4-weight")(ids).logits.float()
    # int4 (16 levels per group) moves each weight by up to 1/30 of its group's range: the logits follow
    # within a few per cent of their scale on a 2-layer model (no exact bound is claimed here)
    assert float((got - want).abs().max()) <= 0.25 * float(want.abs().max())


def _cli(argv):
    from sinkdlm.cli import main

    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        main(argv)
    return exit_.value.code, err.getvalue()


@pytest.mark.parametrize("extra,words", [
    (["--quantize", "int3"], "--quantize must be one of int8-weight | int8-dynamic | int4-weight"),
    pytest.param(["--quantize", "int4-weight", "--device", "cpu"], "--quantize int4-weight has no torchao kernel on cpu",
                 marks=needs_torchao),
    (["--kv-cache-dtype", "int8"], "--kv-cache-dtype=int8 stores the KV cache's keys and values, and no cache is in use"),
    (["--kv-cache-dtype", "int4", "--cache", "prefix"], "--kv-cache-dtype must be int8"),
])
def test_cli_refuses_before_any_weight(extra, words, tmp_path, monkeypatch):
    import sinkdlm.checkpoint.manager as manager
    from helpers import word_tokenizer

    model = tiny_model(vocab_size=47, mask_token_id=46).float()
    model.save_pretrained(tmp_path / "m", tokenizer=word_tokenizer())

    def no_weights(*args, **kwargs):
        raise AssertionError("the weights were read before the refusal")

    monkeypatch.setattr(manager, "load_checkpoint", no_weights)
    code, err = _cli(["generate", "--model", str(tmp_path / "m"), "--prompt", "w1 w2", "--gen-length", "4",
                      "--steps", "4", *extra])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and words in lines[0], err


@pytest.mark.parametrize("command", ["analyze", "eval"])  # chat: the same load (and a chat template first)
def test_every_loading_command_refuses_an_unknown_scheme_before_any_weight(command, tmp_path, monkeypatch):
    import sinkdlm.checkpoint.manager as manager
    from helpers import word_tokenizer

    tiny_model(vocab_size=47, mask_token_id=46).float().save_pretrained(tmp_path / "m", tokenizer=word_tokenizer())
    monkeypatch.setattr(manager, "load_checkpoint", lambda *a, **k: pytest.fail("the weights were read"))
    (tmp_path / "p.txt").write_text("w1 w2 w3\n")
    model = str(tmp_path / "m")
    argv = {"analyze": ["analyze", "--model", model, "--prompts", str(tmp_path / "p.txt"), "--gen-length", "2",
                        "--out", str(tmp_path / "a")],
            "eval": ["eval", "--model", model, "--tasks", "shakespeare_cloze", "--out", str(tmp_path / "e.json")]}[command]
    code, err = _cli([*argv, "--quantize", "int3"])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "--quantize must be one of" in lines[0], err


def test_train_has_no_quantize():
    code, err = _cli(["train", "--quantize", "int8-weight", "--max-steps", "1"])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "--quantize" in lines[0], err


def test_the_lm_eval_model_args_carry_both_options(tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    import sinkdlm.checkpoint.manager as manager
    from helpers import word_tokenizer
    from sinkdlm.evaluation.lm_eval_model import SinkDLMEvalModel, lm_eval_config

    config = lm_eval_config({"pretrained": "m", "quantize": "int8-dynamic", "cache": "dual", "kv_cache_dtype": "int8"})
    assert (config.quantize, config.cache, config.kv_cache_dtype) == ("int8-dynamic", "dual", "int8")
    assert lm_eval_config({"pretrained": "m", "quantize": "none"}).quantize is None
    # without cache= only a block model (whose cache is always on) can use it: the model's header decides, before
    # any weight is read (tests/evaluation/test_block_subblocks.py: the block model's int8 cache)
    assert lm_eval_config({"pretrained": "m", "kv_cache_dtype": "int8"}).kv_cache_dtype == "int8"
    tiny_model(num_sink_tokens=1, mask_token_id=46).save_pretrained(tmp_path / "m", tokenizer=word_tokenizer())
    monkeypatch.setattr(manager, "load_checkpoint", lambda *a, **kw: pytest.fail("weights read before the check"))
    with pytest.raises(ValueError, match="no cache is in use"):
        SinkDLMEvalModel.create_from_arg_obj({"pretrained": str(tmp_path / "m"), "kv_cache_dtype": "int8"})
