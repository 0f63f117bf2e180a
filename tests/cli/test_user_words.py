"""Messages in the user's words (issue 53): the Python API names its arguments (the command line re-spells
them as flags), a Hub id given as a path is told to download it first, a missing example model says how to
fetch it, and --dtype lists its choices as the flag takes them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sinkdlm.config.checks import check_dtype, check_sampler_values, cli_message
from sinkdlm.io.files import check_model_path, default_cache_dir

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_a_hub_id_is_told_to_download_it_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        check_model_path(HUB_ID)
    msg = str(err.value)
    assert msg.startswith(f"model {HUB_ID!r} is not a local file or directory")
    assert "sinkdlm reads local files; download it first" in msg and f"huggingface-cli download {HUB_ID}" in msg
    # the command line names its flag; a local folder of that name is a plain missing path, not a Hub id
    assert cli_message(msg, ["--model"]).startswith(f"--model {HUB_ID!r}")
    (tmp_path / "HuggingFaceTB").mkdir()
    with pytest.raises(ValueError, match="does not exist: pass a model directory"):
        check_model_path(HUB_ID)


def test_a_missing_example_model_says_how_to_fetch_it():
    missing = default_cache_dir() / "models" / "not-fetched.gguf"
    with pytest.raises(ValueError) as err:
        check_model_path(missing)
    assert "make example-model" in str(err.value) and "fetch_example_model()" in str(err.value)
    assert not str(err.value).startswith("--")


@pytest.mark.parametrize("dtype", ["float8", "int8", "torch.int8", "bf16"])
def test_dtype_lists_the_choices_as_the_flag_takes_them(dtype):
    with pytest.raises(ValueError) as err:
        check_dtype(dtype)
    msg = str(err.value)
    assert msg.startswith(f"dtype {dtype!r} is not one of float32, bfloat16, float16") and "torch.bfloat16" not in msg
    assert cli_message(msg, ["--dtype"]).startswith(f"--dtype {dtype!r}")
    assert check_dtype("auto") is None and check_dtype(None) is None and check_dtype("torch.bfloat16") == "bfloat16"


@pytest.mark.parametrize("field,value,words", [("temperature", -1.0, "temperature must be a finite number >= 0"),
                                               ("top_p", 2.0, "top_p must lie in (0, 1]"),
                                               ("top_k", 0, "top_k must be an integer >= 1"),
                                               ("eps", 1.0, "eps must lie in (0, 1)")])
def test_sampler_values_name_the_argument(field, value, words):
    settings = SimpleNamespace(**{"temperature": 0.0, "top_p": None, "top_k": None, "alg_temp": 0.0, "eps": 1e-3,
                                  field: value})
    with pytest.raises(ValueError) as err:
        check_sampler_values(settings)
    assert str(err.value).startswith(words)  # the argument, not `--top-p`
    assert cli_message(str(err.value), [f"--{field.replace('_', '-')}"]).startswith(f"--{field.replace('_', '-')}")


def test_lm_eval_model_args_device_wins_over_lm_evals_own_flag(tmp_path):
    """`--model_args pretrained=DIR,device=cpu` beside lm-eval's always-passed `--device` (cuda:0 by default)
    raised "got multiple values for keyword argument 'device'"; the model's own argument wins."""
    pytest.importorskip("lm_eval")
    import fuzz_world
    from sinkdlm.evaluation.lm_eval_model import SinkDLMEvalModel

    world = fuzz_world.build(tmp_path / "w")
    lm = SinkDLMEvalModel.create_from_arg_obj({"pretrained": world["ok"], "device": "cpu"},
                                              {"device": "cuda:7", "batch_size": 4})
    assert str(lm._device) == "cpu"
