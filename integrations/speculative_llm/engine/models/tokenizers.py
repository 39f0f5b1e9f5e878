"""Tokenizers of the local engine: one small interface over Hugging Face's and llama.cpp's.

The engine, the text assembly (``request.text``) and the backend only need to turn text into ids,
ids into text, and chat messages into a prompt through the model's chat template. Both
runners' tokenizers provide that: ``HfTokenizer`` wraps a ``transformers`` tokenizer,
``runners.llama_cpp.model.LlamaCppTokenizer`` speaks to llama.cpp's vocabulary. Chat templates
of GGUF files are rendered by ``render_chat_template`` the way ``transformers`` renders
them (a sandboxed Jinja environment with the same helpers).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from speculative_llm.errors import ConfigError

__all__ = ["HfTokenizer", "Tokenizer", "render_chat_template"]


@runtime_checkable
class Tokenizer(Protocol):
    """What the local engine needs of a tokenizer."""

    @property
    def chat_template(self) -> str | None:
        """The model's chat template (Jinja), or None for base models without one."""
        ...

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Tokens that end a generation."""
        ...

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; special tokens written in the text are recognised."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of ``token_ids``, special (control) tokens left out."""
        ...

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text of ``messages`` through the chat template."""
        ...

    def vocabulary(self) -> Sequence[bytes]:
        """Every token's bytes, by id (for vocabulary checks and grammar masks)."""
        ...


class HfTokenizer:
    """A Hugging Face tokenizer behind the ``Tokenizer`` interface.

    Args:
        tokenizer: A ``transformers`` tokenizer.
        eos_token_ids: End-of-sequence ids (the model's generation config knows more of
            them than the tokenizer).
    """

    def __init__(self, tokenizer: Any, eos_token_ids: frozenset[int]) -> None:
        self.hf_tokenizer = tokenizer
        self._eos_token_ids = eos_token_ids
        self._vocabulary: list[bytes] | None = None

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's chat template, if it has one."""
        template = getattr(self.hf_tokenizer, "chat_template", None)
        return template if isinstance(template, str) and template else None

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """End-of-sequence ids."""
        return self._eos_token_ids

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``."""
        ids: list[int] = self.hf_tokenizer(text, add_special_tokens=add_special_tokens).input_ids
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` without special tokens."""
        text: str = self.hf_tokenizer.decode(list(token_ids), skip_special_tokens=True)
        return text

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text through ``apply_chat_template``."""
        extra: dict[str, Any] = {"tools": list(tools)} if tools else {}
        text: str = self.hf_tokenizer.apply_chat_template(
            [dict(message) for message in messages],
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **extra,
        )
        return text

    def vocabulary(self) -> Sequence[bytes]:
        """Each id's token string as UTF-8 (the tokenizer's own spelling)."""
        if self._vocabulary is None:
            by_id = sorted(self.hf_tokenizer.get_vocab().items(), key=lambda item: item[1])
            size = (by_id[-1][1] + 1) if by_id else 0
            vocabulary = [b""] * size
            for token, token_id in by_id:
                vocabulary[token_id] = token.encode("utf-8")
            self._vocabulary = vocabulary
        return self._vocabulary


def _raise_exception(message: str) -> None:
    raise ConfigError(f"The model's chat template refused the messages: {message}")


def _to_json(value: Any, indent: int | None = None, ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _strftime_now(format_string: str) -> str:
    return datetime.now().strftime(format_string)


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
) -> str:
    """Render a Hugging Face-style chat template (as stored in GGUF files).

    The environment matches ``transformers``' ``apply_chat_template``: sandboxed,
    ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson``
    filter that keeps non-ASCII text, and the ``raise_exception`` and ``strftime_now``
    functions templates call.

    Raises:
        ConfigError: The template raised (for example it refuses a role order).
    """
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    environment.filters["tojson"] = _to_json
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    try:
        compiled = environment.from_string(template)
        return compiled.render(
            messages=[dict(message) for message in messages],
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except TemplateError as error:
        raise ConfigError(
            f"The model's chat template could not be rendered: {error}. Send a plain prompt "
            "instead of messages, or use a model whose template renders.",
            field="messages",
        ) from error
