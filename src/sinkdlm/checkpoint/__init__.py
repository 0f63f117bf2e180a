"""The checkpoint manager, above model and tokenizer (nanochat's `checkpoint_manager`).

`manager` opens any model people have (a sinkdlm checkpoint, LLaDA, Dream, Qwen2/LLaMA, a `.gguf`
file) as model + tokenizer from one parsed `ModelSource`; `example_model` fetches and checks the
example real model (SmolLM2-135M as GGUF). This `__init__` imports nothing, so the command line's
`--help` path does not pay for torch.
"""
