"""A request's prompt as the target's token ids: chat template, plain transcript, tools.

Kept apart from ``LocalBackend`` so that what the model is shown is decided in one place:
the tool plan (``tools.plan_tools``) is made here once per request, and the backend uses
the same plan for the prompt and for the grammar of the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from speculative_llm.backends.local.models.tokenizers import Tokenizer
from speculative_llm.backends.local.request.tools import ToolPlan, plan_tools
from speculative_llm.types import GenerationRequest, Message

__all__ = ["EncodedPrompt", "encode_messages", "encode_request", "template_message"]

_FALLBACK_ROLES = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}


@dataclass(frozen=True, slots=True)
class EncodedPrompt:
    """A request's prompt, ready for the engine.

    Attributes:
        tokens: The prompt's token ids.
        tools: How the request's tools were offered (None: it offers none, or
            ``tool_choice="none"``).
    """

    tokens: list[int]
    tools: ToolPlan | None


def encode_request(request: GenerationRequest, tokenizer: Tokenizer) -> EncodedPrompt:
    """The request's prompt token ids (chat template applied to messages), with its tool plan.

    Models without a chat template (base models such as gemma3-270m) get a plain
    transcript: ``User: ...`` lines followed by ``Assistant:``. A request with tools is
    encoded as ``tools.plan_tools`` plans it.

    Raises:
        ConfigError: Text that cannot be encoded (a lone surrogate), a chat template that
            refuses the messages, or tools that cannot be offered.
    """
    plan = plan_tools(request, tokenizer)
    if plan is not None:
        tokens = encode_messages(tokenizer, plan.messages, plan.template_tools)
    elif request.messages is None:
        assert request.prompt is not None
        tokens = tokenizer.encode(request.prompt)
    else:
        tokens = encode_messages(tokenizer, request.messages, None)
    return EncodedPrompt(tokens, plan)


def encode_messages(
    tokenizer: Tokenizer, messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None
) -> list[int]:
    """Token ids of a conversation: its chat template, or a plain transcript without one."""
    if tokenizer.chat_template:
        text = tokenizer.render_chat([template_message(m) for m in messages], tools=tools)
        # The template already holds the special tokens (BOS included).
        return tokenizer.encode(text, add_special_tokens=False)
    transcript = "".join(f"{_FALLBACK_ROLES[m.role]}: {m.content}\n" for m in messages)
    return tokenizer.encode(transcript + "Assistant:")


def template_message(message: Message) -> dict[str, Any]:
    """One message as chat templates take it."""
    rendered: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        # Chat templates take the arguments as a mapping (OpenAI's wire format is text).
        rendered["tool_calls"] = [
            {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        rendered["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        rendered["name"] = message.name
    return rendered
