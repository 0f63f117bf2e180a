"""sinkdlm: masked diffusion LMs with an attention sink."""
