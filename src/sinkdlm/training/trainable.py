"""What a run trains (`TrainConfig.trainable`, docs/method.md §12): every weight, the sink parameters only, or LoRA.

* `all`: every parameter (the default, as before).
* `sink`: only the sink parameters (`sink_embeddings` [n, d], every layer's `sink_logit` [H]) keep
  `requires_grad`; the optimizer (`trainer.build_optimizer`) skips the frozen rest, so it holds no state
  for it and AdamW's weight decay never touches it: the frozen weights stay bitwise the initial ones.
  A run from a diffusion LM (`--init-from` a DLM that has its sinks: the base, loaded as it is) stores
  what it trains (`save_sinks`): the sink parameters (`sink_parameters.safetensors`), the model's
  config.json, and the base's path and sha256 (`sink_base.json`); the optimizer state beside them holds the
  sinks' alone. The loader (`model.loader`) opens it as a model everywhere (the base's weights, checked by
  their sha256, with the trained sinks over them); `sinkdlm merge` writes it as a plain checkpoint. A run
  whose frozen weights are made on the fly (a preset's new model, an AR model converted on load) has no
  base on disk to refer to, so its checkpoints are whole models, as for `all`.
* `lora`: peft's LoRA adapters (`peft.get_peft_model`, public API) on the projections named by
  `--lora-targets`, rank `--lora-rank`, scale `--lora-alpha / --lora-rank`, no dropout (a step stays a pure
  function of `(seed, step)`), plus the sink parameters, trainable as they are. A checkpoint holds the
  adapters in peft's own format (`adapter_config.json` + `adapter_model.safetensors`, written by
  `PeftModel.save_pretrained`, opened by `PeftModel.from_pretrained` on the base) and the trained sink
  parameters beside them (`sink_parameters.safetensors`: peft saves only modules, and the sinks are bare
  parameters). The base is the model the run starts from, rebuilt from the run's config
  (`model_init.build_model`: the same seed draws the same initialisation); `sinkdlm merge`
  (`training.merge`) folds adapters and sinks into a plain sinkdlm checkpoint.

Every refusal here comes before a weight is read: `check_trainable` takes the model's config only.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from sinkdlm.config import ModelConfig
from sinkdlm.config.train import TrainConfig
from sinkdlm.io.atomic import atomic_write_json
from sinkdlm.io.files import CONFIG_NAME, SINK_BASE_NAME, SINKS_NAME, CheckpointError, save_state_dict, weights_sha256

ADAPTER_CONFIG = "adapter_config.json"  # peft's names (PeftModel.save_pretrained)
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def check_trainable(cfg: TrainConfig, base: ModelConfig) -> None:
    """Refuse `--trainable sink` on a model without sink parameters (sink tokens or logits): `base` is the
    preset's or the --init-from model's config, before the run's switches."""
    values = {"num_sink_tokens": base.num_sink_tokens, "sink_logit": base.sink_logit, **cfg.model_switches()}
    if cfg.trainable == "sink" and not (values["num_sink_tokens"] > 0 or values["sink_logit"]):
        raise ValueError(
            "--trainable sink trains the sink parameters, but this model has none and the run adds none; add a sink "
            "with --num-sink-tokens 1 (a --init-from diffusion LM: `sinkdlm convert --from-hf MODEL --out DIR "
            "--num-sink-tokens 1` first) or --sink-logit"
        )


def sink_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """{name: parameter} of the sink embeddings and sink logits, in the model's own (sinkdlm) names."""
    return {name: p for name, p in model.named_parameters()
            if name == "sink_embeddings" or name.endswith(".sink_logit")}


def apply_trainable(model, cfg: TrainConfig, adapter: Path | None = None):
    """Set what trains in `model`, in place; returns the `PeftModel` for `lora` (its modules injected into
    `model`, which keeps running the forward), else None. `adapter`: a `lora` checkpoint to resume from
    (its adapters and sink parameters are loaded into `model`, the base)."""
    if cfg.trainable == "all":
        return None
    if cfg.trainable == "sink":
        sinks = set(sink_parameters(model).values())
        for p in model.parameters():
            p.requires_grad_(p in sinks)
        return None
    if adapter is not None:
        return load_adapter(model, adapter, is_trainable=True)
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(cfg.seed)  # lora_A's draw: the same run starts from the same adapters
    peft_model = get_peft_model(model, LoraConfig(
        r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=cfg.lora_target_modules(), lora_dropout=0.0,
    ))
    for p in sink_parameters(model).values():
        p.requires_grad_(True)
    return peft_model


def sink_base(cfg: TrainConfig) -> Path | None:
    """The frozen base a `--trainable sink` run's checkpoints refer to: its `--init-from` diffusion LM, which the
    run loads as it is (`model_init.build_model`); None where the run stores whole models (module docstring)."""
    if cfg.trainable != "sink" or cfg.init_from is None or cfg.fsdp:
        return None
    return _non_ar_path(str(cfg.init_from))


@functools.lru_cache(maxsize=8)
def _non_ar_path(init_from: str) -> Path | None:
    from sinkdlm.checkpoint.manager import open_source

    return None if open_source(init_from, flag="init_from").is_autoregressive else Path(init_from).resolve()


@functools.lru_cache(maxsize=8)
def _base_sha256(path: str, mtime_ns: int, size: int) -> str:
    return weights_sha256(path)  # once per run (and again if the base changes), not per checkpoint


def save_sinks(model: torch.nn.Module, directory: Path, base: Path) -> None:
    """A `--trainable sink` checkpoint's model: the trained sink parameters, the model's config.json and its
    frozen base's path and weights sha256 (`sink_base.json`), written into `directory`."""
    sinks = sink_parameters(model)
    save_state_dict({k: v.detach().cpu() for k, v in sinks.items()}, Path(directory) / SINKS_NAME)
    stat = base.stat()  # a directory's changes when its weights are replaced (written beside, then renamed)
    atomic_write_json(Path(directory) / SINK_BASE_NAME,
                      {"base": str(base), "sha256": _base_sha256(str(base), stat.st_mtime_ns, stat.st_size)})
    atomic_write_json(Path(directory) / CONFIG_NAME, model.config.to_dict())  # last: the directory is whole


def save_adapter(peft_model, directory: Path) -> None:
    """peft's adapter files (`PeftModel.save_pretrained`) and the sink parameters into `directory`."""
    peft_model.save_pretrained(str(directory))
    sinks = sink_parameters(peft_model.get_base_model())
    if sinks:
        save_state_dict({k: v.detach().cpu() for k, v in sinks.items()}, Path(directory) / SINKS_NAME)


def is_adapter_checkpoint(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def check_adapter_fits(model: torch.nn.Module, directory: str | Path) -> None:
    """Refuse adapters (and sink parameters) whose shapes do not fit `model` (it may live on the meta
    device: only the safetensors headers and the modules' shapes are read)."""
    from safetensors import safe_open

    directory = Path(directory)
    wrong = []
    with safe_open(str(directory / ADAPTER_WEIGHTS), "pt") as f:
        for key in f.keys():  # base_model.model.<module>.lora_A.weight [r, in] / lora_B.weight [out, r]
            module_name, _, kind = key.removeprefix("base_model.model.").rpartition(".lora_")
            shape = tuple(f.get_slice(key).get_shape())
            try:
                module = model.get_submodule(module_name)
            except AttributeError:
                wrong.append(f"{module_name} (not in the base)")
                continue
            got = shape[1] if kind.startswith("A") else shape[0]
            want = module.in_features if kind.startswith("A") else module.out_features
            if got != want:
                wrong.append(f"{key}: {shape} vs {module_name} {tuple(module.weight.shape)}")
    sinks_file = directory / SINKS_NAME
    have = {k: tuple(p.shape) for k, p in sink_parameters(model).items()}
    if sinks_file.is_file():
        with safe_open(str(sinks_file), "pt") as f:
            saved = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
        wrong += [f"{k}: {saved.get(k)} vs the base's {have.get(k)}" for k in sorted(set(saved) | set(have))
                  if saved.get(k) != have.get(k)]
    if wrong:
        raise ValueError(f"the adapters in {directory} do not fit the base model (a different model or shape): "
                         + "; ".join(wrong[:4]))


def load_adapter(model, directory: str | Path, is_trainable: bool = False):
    """`PeftModel.from_pretrained(model, directory)` with the sink parameters loaded too; shapes checked first."""
    from peft import PeftModel
    from safetensors.torch import load_file

    directory = Path(directory)
    check_adapter_fits(model, directory)
    peft_model = PeftModel.from_pretrained(model, str(directory), is_trainable=is_trainable)
    sinks = sink_parameters(model)
    if (directory / SINKS_NAME).is_file():
        try:
            saved = load_file(str(directory / SINKS_NAME))
        except Exception as e:  # safetensors raises several types for truncated/corrupt files
            raise CheckpointError(f"{directory / SINKS_NAME} is missing or corrupt ({e})") from e
        with torch.no_grad():
            for name, p in sinks.items():
                p.copy_(saved[name])
    for p in sinks.values():
        p.requires_grad_(is_trainable)
    return peft_model
