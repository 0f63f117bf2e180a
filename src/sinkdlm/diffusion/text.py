"""Text in, text out: `generate_text` encodes a prompt (through the model's chat template with `chat=True`),
samples with `sinkdlm.generate` and decodes what came out, cut at the end of the text; `generate_texts` does
so for several prompts in one batch (each gets the tokens it gets alone).

Where the text ends: the tokenizer's end-of-text token and, with a chat template, the tokens that open
and close a turn (`<|im_start|>`, `<|im_end|>`), so a role name never reaches the output. An
autoregressive model stops decoding there; a diffusion LM fills all `gen_length` positions at once, so
its positions after the end are set to the end-of-text token, as LLaDA's generations pad with EOS.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sinkdlm.config.checks import check_sample_settings
from sinkdlm.config.commands import SampleConfig, TextOptions
from sinkdlm.config.fields import with_overrides
from sinkdlm.diffusion.sampling import generate


@dataclass
class GeneratedText:
    """What `generate_text` returns."""

    text: str  # the decoded continuation, special tokens dropped, cut at the end of the text
    tokens: list[int]  # the gen_length generated ids (after the end: the end-of-text id)
    steps_taken: int
    seconds: float
    blank: bool  # no letter or digit came out: only whitespace, punctuation or special tokens
    truncated: bool  # the text ran to gen_length with no end-of-text (or end-of-turn) token: cut off


def encode_prompt(tokenizer, prompt: str | list[dict], chat: bool, system: str | None = None) -> list[int]:
    """The prompt's ids: as is, or as a user turn of the tokenizer's chat template (after the `system`
    message, when given) followed by the assistant's turn opening (`add_generation_prompt`). With `chat`,
    `prompt` may be the conversation so far: a list of {"role", "content"} messages ending with the user's."""
    if system is not None and not chat:
        raise ValueError("system is a message of the chat template: it needs chat=True")
    if not chat:
        ids = tokenizer(prompt)["input_ids"]
    else:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("chat=True needs the model's chat template, and its tokenizer has none; "
                             "leave chat out and give the plain prompt")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if system is not None:
            messages = [{"role": "system", "content": system}, *messages]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError("the prompt encodes to no tokens; give a non-empty prompt")
    return ids


def stop_token_ids(tokenizer, chat: bool) -> tuple[int, ...]:
    """The ids that end the text: end-of-text, and with `chat` the special tokens that close and open a
    turn, read off the chat template rendered around placeholder messages (ChatML's `<|im_end|>` and
    `<|im_start|>`, Llama 3's `<|eot_id|>` and `<|start_header_id|>`), so no role name is decoded."""
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    stops = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    if chat:  # the special tokens between a user's message and the assistant's, and after the assistant's
        marker = "\u2063sinkdlm\u2063"  # text no template adds around a message
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": marker}, {"role": "assistant", "content": marker}], tokenize=False)
        around = rendered.split(marker, 1)[-1].replace(marker, "")
        stops += [i for i in tokenizer(around, add_special_tokens=False)["input_ids"] if i in special]
    return tuple(dict.fromkeys(stops))


def generate_text(model, tokenizer, prompt: str | list[dict], config: SampleConfig | None = None, *,
                  chat: bool = TextOptions.chat, stop_at_eos: bool = TextOptions.stop_at_eos,
                  system: str | None = TextOptions.system, callback=None, **overrides) -> GeneratedText:
    """Sample a continuation of `prompt` (a string) and decode it.

    `config`/`overrides`: the decoding settings (`SampleConfig`, as for `sinkdlm.generate`), checked against
    the model's kind first (an autoregressive model refuses the diffusion-only ones, named). `chat`: wrap
    the prompt in the model's chat template and end the text at the end of the assistant's turn.
    `stop_at_eos`: end the text at the end-of-text token (an autoregressive model stops decoding there,
    a diffusion LM's later positions become that token); False keeps all `gen_length` tokens. `system`:
    a system message before the prompt (with `chat`); `prompt` may then be the conversation so far.
    `callback` as for `sinkdlm.generate`."""
    text = TextOptions(chat=chat, stop_at_eos=stop_at_eos, system=system)
    return generate_texts(model, tokenizer, [prompt], config, text=text, callback=callback, **overrides)[0]


def generate_texts(model, tokenizer, prompts: Sequence[str | list[dict]], config: SampleConfig | None = None, *,
                   text: TextOptions | None = None, callback=None, generator=None,
                   **overrides) -> list[GeneratedText]:
    """`generate_text` for several prompts at once: one batch (left-padded), in which every prompt gets the
    tokens it gets alone (each row its own random stream, seeded with `seed`, or from `generator`, a list of
    one `torch.Generator` per prompt; `sinkdlm.generate`). `seconds` is the batch's. `text`: `chat`,
    `stop_at_eos` and `system` as for `generate_text` (a `GenerateConfig` is one; None: their defaults)."""
    text = text or TextOptions()
    settings = with_overrides(SampleConfig, config, overrides, "generate_text")
    # a command's config (`GenerateConfig`) is a SampleConfig too: keep only the sampler's fields
    settings = SampleConfig(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(SampleConfig)})
    block_model = model.config.block_size is not None
    check_sample_settings(settings, autoregressive=model.config.causal, block_model=block_model,
                          block_size=model.config.block_size)
    ids = [encode_prompt(tokenizer, prompt, text.chat, text.system) for prompt in prompts]
    stops = stop_token_ids(tokenizer, text.chat) if text.stop_at_eos else ()
    if stops and (model.config.causal or block_model):  # these stop decoding a row at its end (§10, §13)
        settings = dataclasses.replace(settings, stop_token_ids=stops)
    start = time.perf_counter()
    per_row = {} if generator is None else {"generator": generator}  # None: the rows' streams come from `seed`
    out = generate(model, ids[0] if len(ids) == 1 else ids, settings, callback=callback, return_dict=True, **per_row)
    seconds = time.perf_counter() - start
    rows = out.sequences[:, out.prompt_length:].tolist()
    return [decode_generated(tokenizer, tokens, stops, out.steps_taken, seconds) for tokens in rows]


def decode_generated(tokenizer, tokens: list[int], stops: Sequence[int], steps_taken: int,
                     seconds: float) -> GeneratedText:
    """One row's generated ids as text, cut at the first of the `stops` ids; after it the ids become the
    end-of-text id, as LLaDA's generations pad with EOS."""
    end = next((i for i, t in enumerate(tokens) if t in stops), len(tokens))
    if end < len(tokens):
        tokens = tokens[:end] + [stops[0]] * (len(tokens) - end)
    text = tokenizer.decode(tokens[:end], skip_special_tokens=True)
    return GeneratedText(text=text, tokens=tokens, steps_taken=steps_taken, seconds=seconds,
                         blank=not any(c.isalnum() for c in text), truncated=bool(stops) and end == len(tokens))


class Conversation:
    """A conversation with a model through its chat template: `reply(text)` adds the user's message, samples
    the assistant's answer to the whole history (after the `system` message, when given) and adds it too.
    `config`/`overrides`: the decoding settings of every reply, as for `generate_text`."""

    def __init__(self, model, tokenizer, config: SampleConfig | None = None, *, system: str | None = None,
                 **overrides):
        self.model, self.tokenizer, self.system = model, tokenizer, system
        self.settings = with_overrides(SampleConfig, config, overrides, "Conversation")
        self.messages: list[dict] = []  # the history: {"role": "user" | "assistant", "content": ...}
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("a conversation needs the model's chat template, and its tokenizer has none; "
                             "use `sinkdlm generate` with a plain prompt")

    def reply(self, text: str) -> GeneratedText:
        messages = [*self.messages, {"role": "user", "content": text}]
        out = generate_text(self.model, self.tokenizer, messages, self.settings, chat=True, system=self.system)
        self.messages = [*messages, {"role": "assistant", "content": out.text}]
        return out
