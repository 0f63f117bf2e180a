"""DiffusionLM: a bidirectional LLaMA/Qwen2-layout Transformer with optional extra sink tokens.

Architecture only: RMSNorm, RoPE, SwiGLU, GQA, optional QKV bias, optional tied head, optional
gated attention (Appendix A.2, eq. 8-10), `num_sink_tokens` sinks (docs/method.md §3, eq. 5-7) and a
virtual sink column in every softmax row (`sink_logit`: a learned score per head, as gpt-oss;
`softmax_one`: the score fixed at 0, Miller's softmax-off-by-one; its value vector is zero).
The sinks enter a pass in one of two ways, both through `Block.forward` (see `sink.py` for why
this is exact):
  1. riding in the sequence (training, or whenever they are recomputed): `[s; X]` as one batched
     tensor; every projection, norm and MLP runs on it once, and each sink row's attention output is
     set to its own value vector (eq. 6) while only the content queries go to SDPA, unmasked;
  2. as constants (`SinkCache`, the KV cache and the analysis probes): the sinks' keys/values of
     each layer, computed once by `sink_stream()` (the same block code on the sink rows alone), are
     joined to the content's keys in layout order.
Attention backends and masks are chosen by name (`attention.py`); the Fast-dLLM key/value cache is
`cache.KVCache` and everything the analysis asks of a pass (key masks, maps, hooks) is `probe.Probe`;
checkpoints live in `io/files.py`. Parameter names match Hugging Face Qwen2 without the `model.` prefix.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from sinkdlm.config import ModelConfig
from sinkdlm.config.checks import KV_CACHE_DTYPES
from sinkdlm.model import sink as sinklib
from sinkdlm.model.attention import (
    SINK_COLUMN_BACKENDS, apply_rope, block_causal_mask, causal_mask, get_backend, padding_mask, rope_cos_sin,
)
from sinkdlm.model.cache import KVCache
from sinkdlm.model.kv_int8 import Int8KVCache
from sinkdlm.model.fused import Packed, pack
from sinkdlm.model.probe import Probe, ProbePass


@dataclass
class DiffusionLMOutput:
    logits: torch.Tensor  # [B, L, V], content positions only
    # Per layer, over the whole layout sequence S = L + n (only when a `Probe` asks):
    attentions: tuple[torch.Tensor, ...] | None = None  # [B, H, S, S], rows = queries
    values: tuple[torch.Tensor, ...] | None = None  # [B, KVH, S, hd]
    # With sink_logit/softmax_one and `Probe(attentions=True)`: per layer, the probability every query
    # row puts on the virtual sink column `[B, H, S]` (rows of `attentions` sum to 1 minus this).
    virtual_sink_attentions: tuple[torch.Tensor, ...] | None = None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 (as Qwen2/LLaMA do) so bf16 runs match their reference numerics.
        y = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * y.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        hd, h, kvh, d = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
        self.num_heads, self.num_kv_heads, self.head_dim = h, kvh, hd
        self.q_proj = nn.Linear(d, h * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(d, kvh * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(d, kvh * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(h * hd, d, bias=False)
        # Qwen3's QK norm: one RMSNorm over each head's hd channels of q and of k, before the rotary
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        # eq. 9: an element-wise gate per head channel, computed from the layer input X.
        self.g_proj = nn.Linear(d, h * hd, bias=False) if cfg.gated_attention else None
        # The virtual sink column's score per head: learned (gpt-oss) or fixed at 0 (softmax_1).
        self.sink_logit = nn.Parameter(torch.empty(h)) if cfg.sink_logit else None
        self.softmax_one = cfg.softmax_one
        self.qkv: Packed | None = None  # q/k/v as one matmul at inference (`DiffusionLM.fuse_projections`)

    def project_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`x [B, R, d]` -> q `[B, R, H*hd]`, k, v `[B, R, KVH*hd]` and q|k `[B, R, (H+KVH)*hd]` side by
        side (one matmul, when packed and not training; else None, three matmuls)."""
        linears = (self.q_proj, self.k_proj, self.v_proj)
        if self.qkv is not None and not torch.is_grad_enabled() and self.qkv.holds(linears):
            qkv = self.qkv.joint(x)
            q, k, v = qkv.split(self.qkv.rows, dim=-1)
            return q, k, v, qkv[..., :self.qkv.rows[0] + self.qkv.rows[1]]
        return *(lin(x) for lin in linears), None

    def sink_column(self, ref: torch.Tensor) -> torch.Tensor | None:
        """The virtual column's logit `[H]`, or None when the model has none."""
        if self.sink_logit is not None:
            return self.sink_logit
        if self.softmax_one:
            return ref.new_zeros(self.num_heads)
        return None

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        b, l, _ = x.shape
        return x.view(b, l, n, self.head_dim).transpose(1, 2)  # [B, n, L, hd]

    def kv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys before rotation and values, `[B, KVH, L, hd]`."""
        return self._heads(self.k_proj(x), self.num_kv_heads), self._heads(self.v_proj(x), self.num_kv_heads)

    def output(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """`y [B, H, L, hd]` -> `O = (Y ⊙ σ(X W_g)) W_O` (eq. 8-10; plain `Y W_O` without the gate)."""
        b, _, l, _ = y.shape
        return self.project(y.transpose(1, 2).reshape(b, l, -1), x)

    def project(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """`y [B, L, H * hd]` (heads merged) -> `O = (Y ⊙ σ(X W_g)) W_O`."""
        if self.g_proj is not None:
            y = y * torch.sigmoid(self.g_proj(x))
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up: Packed | None = None  # gate/up as one matmul at inference (`DiffusionLM.fuse_projections`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        linears = (self.gate_proj, self.up_proj)
        if self.gate_up is not None and not torch.is_grad_enabled() and self.gate_up.holds(linears):
            gate, up = self.gate_up.joint(x).split(self.gate_up.rows, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)  # SwiGLU


@dataclass
class SinkRows:
    """How the sinks enter one pass (docs/method.md §3, eq. 5-7), the same for every layer.

    `rows` sink rows ride in the hidden sequence `h` itself (front or end, in layout order): their
    keys/values are computed with the content's in one batched projection, and their attention output
    is set to their own value vector (eq. 6), so no second stream runs. Or `rows = 0` and the sinks'
    keys/values are constants of the model (`SinkCache`), joined to the content's keys per layer.
    `keep [1, R, 1, 1]` (zero-value sink, Table 5): 0 on sink rows, 1 on content.
    """

    rows: int
    position: str
    keep: torch.Tensor | None = None


class Attending(NamedTuple):
    """How one pass's layers attend, the same at every layer: the attention backend (`attention.get_backend`;
    None: no content query, the sink stream), whether it returns the probabilities (a probe's maps), and the
    static `KVCache` the content's keys/values are written to and read from (None: none). A named tuple, which
    `torch.compile` traces through (the compiled decoding step, `diffusion/steps.py`)."""

    backend: object | None = None
    need_probs: bool = False
    cache: KVCache | None = None


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, h, rope, sinks: SinkRows, sink_kv, mask, attending: Attending, index=0):
        """h `[B, R, d]`: `sinks.rows` sink rows and L content columns, in layout order.

        rope: (cos, sin) `[B|1, R, hd]` for the keys of all rows and `[B|1, L, hd]` for the content
        queries, or None: no rotation (the sink cache keeps keys before rotation). sink_kv: the sinks'
        rotated constant keys/values `[B|1, KVH, n, hd]`, when they do not ride in `h`. attending: the pass's
        backend, maps and `cache`, the static `KVCache` (layer `index`): the content rows are its columns
        `cache.start .. +L`, written there in place, and attention reads its whole buffer (the sinks' columns
        included: then sink_kv is None).
        Returns (h, probs `[B, H, L, S]` | None (S + 1 columns with a virtual sink column, last),
        values `[B, KVH, S, hd]` in layout order, kv, p_self `[B, H, rows]` | None), where kv is the
        sink rows' (k before rotation, v) when `h` holds sinks only (the sink cache), else None.
        """
        attn = self.self_attn
        hd, nh, nkv = attn.head_dim, attn.num_heads, attn.num_kv_heads
        groups = nh // nkv
        x = self.input_layernorm(h)
        b, r, _ = x.shape
        n, where = sinks.rows, sinks.position
        q, k, v, qk = attn.project_qkv(x)
        q, k, v = q.view(b, r, nh, hd), k.view(b, r, nkv, hd), v.view(b, r, nkv, hd)
        if attn.q_norm is not None:  # QK norm (Qwen3): the joint q|k no longer holds the normed values
            q, k, qk = attn.q_norm(q), attn.k_norm(k), None
        if sinks.keep is not None:  # Table 5: the sinks' value vectors are zero at every layer
            v = v * sinks.keep.to(v.dtype)  # in v's dtype: under autocast v stays bf16, as q and k
        column = attn.sink_column(x)
        l = r - n
        y_sink = p_self = None
        if n:  # eq. 6: a sink attends only to itself, so its output is its own value vector
            vs = sinklib.sinks_of(v, n, where, dim=1)
            y_sink = vs[:, :, :, None].expand(b, n, nkv, groups, hd)  # [B, n, KVH, G, hd]
            if column is not None:  # softmax([s_self, b_h]) over its own key and the column
                # RoPE at one position for both q and k leaves s_self unchanged: no rotation needed.
                qs, ks = sinklib.sinks_of(q, n, where, dim=1), sinklib.sinks_of(k, n, where, dim=1)
                s_self = (qs.view(b, n, nkv, groups, hd) * ks[:, :, :, None]).sum(-1) / hd**0.5  # [B, n, KVH, G]
                p_self = torch.sigmoid(s_self - column.to(s_self.dtype).view(nkv, groups))
                y_sink = y_sink * p_self[..., None]
                p_self = p_self.flatten(2).transpose(1, 2)  # [B, H, n]
            q = sinklib.content_of(q, n, where, dim=1)  # the content queries [B, L, H, hd]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, rows, hd]
        kv = (k, v) if not l else None  # the sink cache: keys before rotation
        if rope is not None and qk is not None and not n:  # q, k side by side, one table: one rotation
            qk = apply_rope(qk.view(b, r, nh + nkv, hd).transpose(1, 2), rope[0], rope[1])
            q, k = qk[:, :nh], qk[:, nh:]  # [B, H | KVH, L, hd]
        elif rope is not None:
            cos, sin, cos_q, sin_q = rope
            q, k = apply_rope(q, cos_q, sin_q), apply_rope(k, cos, sin)
        if attending.cache is not None:  # keys are cached after rotation, at their absolute positions
            k, v = attending.cache.write(index, k, v)  # [B, KVH, S, hd], layout order, sinks included
        if sink_kv is not None:
            ks, vs = sink_kv
            k = sinklib.join(ks.expand(b, -1, -1, -1), k, where, dim=2)
            v = sinklib.join(vs.expand(b, -1, -1, -1), v, where, dim=2)
        probs = None
        if l:
            y, probs = attending.backend(q, k, v, mask=mask, need_probs=attending.need_probs,
                                         sink_logit=column)  # [B, H, L, hd]
            y = y.transpose(1, 2)  # [B, L, H, hd]
            # with sink rows the join copies once; without, the reshape does (as any attention layer)
            y = sinklib.join(y_sink, y.view(b, l, nkv, groups, hd), where, dim=1) if n else y.reshape(b, l, nh, hd)
        else:
            y = y_sink
        h = h + attn.project(y.reshape(b, r, nh * hd), x)
        h = h + self.mlp(self.post_attention_layernorm(h))
        return h, probs, v, kv, p_self


class DiffusionLM(nn.Module):
    """A masked diffusion LM. `model(input_ids).logits` is `[B, L, vocab]` for the content only."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        config.validate()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        if config.num_sink_tokens > 0:
            # eq. 5: the sinks' own learned embeddings, outside the vocabulary.
            self.sink_embeddings = nn.Parameter(torch.empty(config.num_sink_tokens, config.hidden_size))
        else:
            self.register_parameter("sink_embeddings", None)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # How a pass computes, not what (HF keeps these on the model too): the attention backend, and
        # whether the sinks' keys/values come from `sink_cache()` (None: when not training).
        self.attn_implementation = "sdpa"
        self.use_sink_cache: bool | None = None
        self._sink_cache: sinklib.SinkCache | None = None
        self.quantization: str | None = None  # the --quantize scheme applied (`model/quantize.py`); None: none
        self.reset_parameters()

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def reset_parameters(self, seed: int | None = None) -> None:
        """N(0, initializer_range) weights, zero biases, unit norms. Each parameter draws from its own
        generator, seeded by (`seed`, its name): every variant of a seed starts its shared parameters
        identical, whatever the switches add (a gate, sinks, a sink logit) and in whatever order, so a
        paired comparison compares the switch, not the draw. `seed` None: torch's `initial_seed()`
        (the run's `torch.manual_seed(seed)`)."""
        std = self.config.initializer_range
        seed = torch.initial_seed() if seed is None else seed

        def draw(name: str, weight: torch.Tensor) -> None:
            gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
            weight.copy_(torch.randn(weight.shape, generator=gen) * std)

        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)) and module.weight is not self.embed_tokens.weight:
                draw(f"{name}.weight", module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        draw("embed_tokens.weight", self.embed_tokens.weight)  # after the head: a tied head keeps these
        if self.sink_embeddings is not None:  # 2 or 4 sinks: the first row is the 1-sink model's
            draw("sink_embeddings", self.sink_embeddings)
        for i, layer in enumerate(self.layers):
            if layer.self_attn.sink_logit is not None:  # as gpt-oss: N(0, initializer_range)
                draw(f"layers.{i}.self_attn.sink_logit", layer.self_attn.sink_logit)

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    # ------------------------------------------------------------------ sink stream
    def sink_stream(self) -> sinklib.SinkCache:
        """The sinks alone through every layer (batch 1, no content, no rotation): their keys before
        rotation and values per layer. The same `Block.forward` as every pass, with only sink rows."""
        cfg = self.config
        n = cfg.num_sink_tokens
        hs = self.sink_embeddings[None]  # [1, n, d]
        rows = self._sink_rows(n, hs)
        ks, vs, ps = [], [], []
        for layer in self.layers:
            hs, _, _, (k, v), p_self = layer(hs, None, rows, None, None, Attending())
            ks.append(k)
            vs.append(v)
            ps.append(p_self)
        return sinklib.SinkCache(ks, vs, p_self=ps if cfg.has_sink_column else None)

    def _sink_rows(self, rows: int, ref: torch.Tensor) -> SinkRows:
        """The pass's `SinkRows`: `rows` sink rows in the hidden sequence of `ref [B, R, d]`."""
        cfg = self.config
        keep = None
        if rows and cfg.sink_zero_value:
            keep = ref.new_ones(1, ref.shape[1], 1, 1)
            sinklib.sinks_of(keep, rows, cfg.sink_position, dim=1).zero_()
        return SinkRows(rows, cfg.sink_position, keep)

    @torch.compiler.disable  # its validity key reads version counters: left out of a compiled step
    @torch.no_grad()
    def sink_cache(self) -> sinklib.SinkCache:
        """The sink stream computed once and reused while no parameter changes (docs/method.md §3).

        Valid across steps and requests: sink hidden states depend on nothing but the weights.
        The key tracks every parameter's in-place version counter, so an optimiser step or a
        `load_state_dict` invalidates it.
        """
        assert self.config.num_sink_tokens > 0, "sink_cache() needs num_sink_tokens > 0"
        key = (self.dtype, self.device, tuple((id(p), p._version) for p in self.parameters()))
        if self._sink_cache is None or self._sink_cache.key != key:
            cache = self.sink_stream()
            cache.key = key
            self._sink_cache = cache
        return self._sink_cache

    def fuse_projections(self) -> None:
        """One matmul for each layer's q/k/v and one for its gate/up at inference (`fused.pack`): the
        parameters become views of the joint tensors; names, values and memory are unchanged. A quantized
        model keeps its projections apart (torchao's weight tensors are not concatenated)."""
        if self.quantization is not None:
            return
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            if a.qkv is None or not a.qkv.holds((a.q_proj, a.k_proj, a.v_proj)):
                a.qkv = pack((a.q_proj, a.k_proj, a.v_proj))
            if m.gate_up is None or not m.gate_up.holds((m.gate_proj, m.up_proj)):
                m.gate_up = pack((m.gate_proj, m.up_proj))

    @torch.no_grad()
    def allocate_cache(self, batch: int, length: int, attention_mask: torch.Tensor | None = None,
                       kv_cache_dtype: str | None = None) -> KVCache:
        """A static `KVCache` (cache.py) for `batch` rows of `length` content columns, once per generation.

        The sinks' rotated keys and values are written at their columns (constants of the model,
        docs/method.md §3), the content's rotary tables and the padding's key mask (`attention_mask`
        `[B, L]`, True = real) are built here, so no pass recomputes them. Allocate it under the
        autocast the passes run in: the buffers take its dtype, as the keys do. `kv_cache_dtype="int8"`:
        the content columns in int8, the sinks' in that dtype (`kv_int8.Int8KVCache`)."""
        cfg = self.config
        n, dev, where = cfg.num_sink_tokens, self.device, cfg.sink_position
        if length > cfg.max_content_length:
            raise ValueError(f"sequence of {length} tokens is longer than the model's {cfg.content_length_note()} "
                             "positions; shorten the input")
        if attention_mask is not None and tuple(attention_mask.shape) != (batch, length):
            raise ValueError(f"attention_mask must be [batch, length] = [{batch}, {length}], "
                             f"got {tuple(attention_mask.shape)}")
        if kv_cache_dtype not in (None, *KV_CACHE_DTYPES):
            raise ValueError(f"kv_cache_dtype must be {' | '.join(KV_CACHE_DTYPES)} or None, got {kv_cache_dtype!r}")
        act_dtype = torch.get_autocast_dtype(dev.type) if torch.is_autocast_enabled(dev.type) else self.dtype
        pos_content, pos_sink = sinklib.positions(batch, length, n, where, attention_mask, dev)
        cos, sin = rope_cos_sin(pos_content, cfg.head_dim, cfg.rope_theta, act_dtype)  # [B|1, L, hd]
        # int8: these buffers hold the sinks' columns only (full precision), the content's are Int8KVCache's
        shape = (batch, cfg.num_key_value_heads, n + (length if kv_cache_dtype is None else 0), cfg.head_dim)
        keys = [torch.zeros(shape, dtype=act_dtype, device=dev) for _ in self.layers]
        values = [torch.zeros(shape, dtype=act_dtype, device=dev) for _ in self.layers]
        mask = None if attention_mask is None else padding_mask(attention_mask)  # [B, 1, 1, L]
        if n:
            use = (not self.training) if self.use_sink_cache is None else self.use_sink_cache
            sinks = self.sink_cache() if use else self.sink_stream()
            cos_s, sin_s = rope_cos_sin(pos_sink, cfg.head_dim, cfg.rope_theta, act_dtype)  # [B|1, n, hd]
            for kb, vb, k, v in zip(keys, values, sinks.k, sinks.v):
                sinklib.sinks_of(kb, n, where, dim=2).copy_(apply_rope(k.to(act_dtype), cos_s, sin_s))
                sinklib.sinks_of(vb, n, where, dim=2).copy_(v.to(act_dtype))
            if mask is not None:  # every content query sees the sinks (eq. 6, second case)
                mask = sinklib.join(mask.new_ones(batch, 1, 1, n), mask, where, dim=-1)  # [B, 1, 1, S]
        if kv_cache_dtype is not None:
            return Int8KVCache(keys, values, cos, sin, mask, where)
        return KVCache(keys, values, cos, sin, mask, offset=n if where == "front" else 0)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        position_ids: torch.Tensor | None = None,
        causal: bool | None = None,
        logits_index: torch.Tensor | slice | tuple[torch.Tensor, torch.Tensor] | None = None,
        cache: KVCache | None = None,
        probe: Probe | None = None,
    ) -> DiffusionLMOutput:
        """
        input_ids      `[B, L]` token ids (content only; the sinks are added here).
        attention_mask `[B, L_total]` bool/int, True = real token (padding is never attended to; rotary
                       positions restart at each row's first real token); L_total = L without a
                       cache, the whole key sequence with one. Or a 4-D `[B|1, 1|H, L, L]` bool
                       content-to-content mask, True = attend (attention annealing, docs/method.md §5).
        position_ids   `[B, L]` rotary positions of the content (default: see `sink.positions`).
        causal         content attends causally (AR parity and annealing); sinks stay visible.
                       None: the model's own `config.causal` (True for an autoregressive model).
        logits_index   run the LM head only on these columns of `input_ids` (a slice or a 1-D
                       index tensor shared by the batch): `.logits` is then `[B, K, V]`; or a pair
                       `(rows, cols)` of 1-D index tensors: `.logits` is `[N, V]` for those N positions
                       (the training loss reads only masked positions; indices built on the host keep
                       the step free of host syncs); or a bool `[B, L]` mask: `[N, V]`, row-major. The head is the largest matmul
                       for 49k-151k vocabularies; callers that read a few positions skip the rest.
        cache          a static `KVCache` (cache.py, from `allocate_cache`): `input_ids` are the content
                       columns `cache.start .. cache.start+L`; their keys/values are written there in
                       place and attention reads the whole cache (Fast-dLLM's prefix and dual caches;
                       from column 0 over every column: the plain forward). Its padding and positions
                       are the ones given to `allocate_cache`.
        probe          a `Probe` (probe.py): key masks, per-layer maps/values, a per-layer hook.
        How, not what: the sinks' keys/values come from the sink cache when `self.use_sink_cache`
        (None: when not training) and the attention runs `self.attn_implementation`.
        """
        cfg = self.config
        b, l, total, causal = self._check_forward(input_ids, attention_mask, position_ids, causal, cache, probe)
        n = cfg.num_sink_tokens
        need_maps = probe is not None and probe.needs_maps
        backend_name = "eager" if need_maps else ((probe and probe.backend) or self.attn_implementation)
        backend = get_backend(backend_name)
        if cfg.has_sink_column and backend_name not in SINK_COLUMN_BACKENDS:
            switch = "sink_logit" if cfg.sink_logit else "softmax_one"
            raise ValueError(
                f"this model has {switch}=True (a virtual sink column in every softmax row), which the "
                f"{backend_name!r} attention backend cannot compute; use one of {sorted(SINK_COLUMN_BACKENDS)}"
            )

        h = self.embed_tokens(input_ids)  # [B, L, d]
        # RoPE in the dtype the projections compute in (bf16 under autocast), so q, k and v reach
        # attention in one dtype and autocast copies none of them (angles are still built in fp32).
        dev = h.device.type
        act_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
        sinks, rows, sink_kv = None, 0, None
        if cache is not None:  # the static cache holds the rotary tables, the key mask and the sinks' columns
            cos, sin = cache.rope(l)
            rope, mask = (cos, sin, cos, sin), cache.mask
        else:
            padding = attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None
            pos_content, pos_sink = sinklib.positions(b, total, n, cfg.sink_position, padding, input_ids.device)
            if position_ids is not None:
                pos_content = position_ids
                if n and cfg.sink_position == "end":  # end sinks follow the last content position (eq. 7)
                    pos_sink = position_ids.amax(-1, keepdim=True) + 1 + torch.arange(n, device=h.device)
            mask = self._content_mask(attention_mask, causal, l, h.device)  # None on the fast path
            if cfg.block_size is not None and (attention_mask is None or attention_mask.dim() == 2):
                # block diffusion: bidirectional within a block, causal across blocks (docs/method.md §13);
                # a 4-D mask is the caller's whole rule (BD3-LM's x_t ⊕ x_0 pass, diffusion/block.py)
                start = n if cfg.sink_position == "front" else 0
                blocks = block_causal_mask(pos_content - start, cfg.block_size)  # [B|1, 1, L, L]
                mask = blocks if mask is None else mask & blocks
            if n > 0:
                use_cache = (not self.training) if self.use_sink_cache is None else self.use_sink_cache
                if use_cache or not self.training or probe is not None:
                    # the sinks' constant keys/values (eq. 6: they depend on the weights only); recomputed
                    # outside training by the same arithmetic as the cache, so the two agree bit for bit
                    sinks = self.sink_cache() if use_cache else self.sink_stream()
                else:  # training: the sinks ride in the sequence, one batched pass, no second stream
                    rows = n
                    h = sinklib.join(self.sink_embeddings[None].to(h.dtype).expand(b, -1, -1), h, cfg.sink_position, dim=1)
                    pos_content = sinklib.join(pos_sink.expand(pos_content.shape[0], -1), pos_content,
                                               cfg.sink_position, dim=1)
                if mask is not None:  # every content query sees the sinks (eq. 6, second case)
                    mask = mask.expand(b, -1, l, -1)
                    mask = sinklib.join(mask.new_ones(*mask.shape[:3], n), mask, cfg.sink_position, dim=-1)
            cos, sin = rope_cos_sin(pos_content, cfg.head_dim, cfg.rope_theta, act_dtype)  # [B|1, R, hd]
            rope = (cos, sin, *((sinklib.content_of(t, rows, cfg.sink_position, dim=1) for t in (cos, sin))
                                if rows else (cos, sin)))  # keys: every row; queries: the content
            if sinks is not None:
                cos_s, sin_s = rope_cos_sin(pos_sink, cfg.head_dim, cfg.rope_theta, act_dtype)
        layout = self._sink_rows(rows, h)

        seen = ProbePass(probe, cfg, l, b, sinks) if probe is not None else None
        attending = Attending(backend, need_maps, cache)
        for i, layer in enumerate(self.layers):
            if sinks is not None:
                sink_kv = (apply_rope(sinks.k[i].to(act_dtype), cos_s, sin_s), sinks.v[i].to(act_dtype))
            layer_mask = mask if probe is None else probe.mask(i, mask, l, n, cfg.sink_position)
            h, probs, v, kv, _ = layer(h, rope, layout, sink_kv, layer_mask, attending, i)
            if seen is not None:
                maps = seen.maps(i, probs) if need_maps else None
                del probs  # before the hook runs: one layer's maps alive, not two copies
                seen.layer(i, maps, v)
                del maps
            # Drop this layer's keys/values now: kept until the next assignment, they would stay alive
            # while the next layer computes its maps (the analysis of an 8B model counts every MiB).
            del v, kv
        if rows:
            h = sinklib.content_of(h, rows, cfg.sink_position, dim=1)  # the content rows [B, L, d]
        if isinstance(logits_index, tuple):  # (rows, cols): [N, d], the head only where the caller reads it
            rows_i, cols_i = logits_index
            h = h.flatten(0, 1).index_select(0, rows_i * h.shape[1] + cols_i)  # no host sync (cf. a bool mask)
        elif isinstance(logits_index, torch.Tensor) and logits_index.dtype == torch.bool:
            h = h[logits_index]  # [N, d]; a bool mask asks the device for N (a host sync on a GPU)
        elif logits_index is not None:
            h = h[:, logits_index]  # [B, K, d]
        logits = self.lm_head(self.norm(h))
        return DiffusionLMOutput(logits=logits, **(seen.output() if seen is not None else {}))

    def _check_forward(self, input_ids, attention_mask, position_ids, causal, cache, probe):
        """Every user error of `forward` before any work; (B, L, key length, causal)."""
        cfg = self.config
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
        b, l = input_ids.shape
        causal = cfg.causal if causal is None else causal
        if attention_mask is not None and attention_mask.dim() not in (2, 4):
            raise ValueError(f"attention_mask must be [B, L] or [B, 1, L, L], got shape {tuple(attention_mask.shape)}")
        total = l
        if cache is not None:
            if causal or attention_mask is not None or position_ids is not None or (
                    probe is not None and (probe.key_masks is not None or probe.needs_maps)):
                raise ValueError(
                    "a KV cache cannot be combined with causal, an attention_mask or position_ids (the cache "
                    "holds the padding and positions given to allocate_cache), key masks or attention maps "
                    "(they need the whole sequence's queries); run without a cache"
                )
            cache.check(len(self.layers), b, l)
            total = cache.length
        if total > cfg.max_content_length and position_ids is None:  # given positions: the caller's to bound
            raise ValueError(
                f"sequence of {total} tokens is longer than the model's {cfg.content_length_note()} "
                "positions; shorten the input"
            )
        if attention_mask is not None and attention_mask.shape[-1] != total:
            raise ValueError(f"attention_mask covers {attention_mask.shape[-1]} columns, the key sequence {total}")
        return b, l, total, causal

    @staticmethod
    def _content_mask(attention_mask, causal: bool, l: int, device) -> torch.Tensor | None:
        """The content queries' mask over the content keys (True = attend); None: attend to all."""
        mask = None
        if attention_mask is not None and attention_mask.dim() == 2:
            mask = padding_mask(attention_mask)  # [B, 1, 1, L_total]
        if causal:
            mask = causal_mask(l, device) if mask is None else mask & causal_mask(l, device)
            if attention_mask is not None and attention_mask.dim() == 2:
                # A left-padding query sees no key at all under a causal mask (its softmax would be NaN,
                # and 0 x NaN leaks into real rows): let it see itself. Real rows see themselves already.
                mask = mask | torch.eye(l, dtype=torch.bool, device=device)
        if attention_mask is not None and attention_mask.dim() == 4:
            mask = attention_mask.bool() if mask is None else mask & attention_mask.bool()
        return mask

    def train(self, mode: bool = True) -> "DiffusionLM":
        """`nn.Module.train`, refused in one line for a quantized model: quantization is for inference here."""
        if mode and self.quantization is not None:
            raise ValueError(f"this model is quantized ({self.quantization}), and quantization is for inference "
                             "here: train the unquantized checkpoint (load it without --quantize)")
        return super().train(mode)

    @contextmanager
    def sink_cache_mode(self, use: bool | None):
        """Within: `use_sink_cache = use` (True reuses the sinks' constant keys/values, False
        recomputes them every pass, None: reuse when not training); the outputs are the same."""
        before, self.use_sink_cache = self.use_sink_cache, use
        try:
            yield self
        finally:
            self.use_sink_cache = before

    # ------------------------------------------------------------------ checkpoints
    def save_pretrained(self, directory, tokenizer=None) -> None:
        from sinkdlm.io.files import save_checkpoint

        save_checkpoint(self, directory, tokenizer=tokenizer)

    @classmethod
    def from_pretrained(cls, path, *args, device=None, dtype=None, **kwargs) -> "DiffusionLM":
        """Load a model directory (sinkdlm, LLaDA, Dream, Qwen2, LLaMA) or a `.gguf` file, or an opened
        `ModelSource` (its config.json parsed once), checking config and weights agree.

        dtype: None or "auto" keeps the stored dtype; a `torch.dtype` or its name casts floats. Extra
        keyword arguments that `transformers.AutoModel*.from_pretrained` passes along (revision,
        config, ...) are accepted and ignored: only local files are read."""
        from sinkdlm.model.loader import build_model  # below this module: it takes the class as an argument

        return build_model(cls, path, device=device, dtype=dtype or kwargs.get("torch_dtype"))

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        total = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            total -= self.embed_tokens.weight.numel()
        return total
