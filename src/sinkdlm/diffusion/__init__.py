"""The diffusion process: forward masking (`noise`), the training loss (`loss`), the reverse process
(`sampling`) and likelihood estimates (`likelihood`)."""
