"""The bottom layer: bytes on disk. Atomic writes (`atomic`), checkpoint JSON and safetensors
(`files`, with `CheckpointError`) and GGUF files (`gguf_file`).

These modules import nothing of sinkdlm above them (no model, tokenizer or format code), so every
layer can read and write through them without an import cycle (`tests/test_layers.py`). This
`__init__` imports nothing, so `import sinkdlm.io.atomic` stays light.
"""
