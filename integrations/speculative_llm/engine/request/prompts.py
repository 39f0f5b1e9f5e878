"""A request's prompt as the target's token ids: chat template, plain transcript, tools.

Kept apart from ``LocalBackend`` so that what the model is shown is decided in one place.
A request with tools is encoded as its tool plan (``tools.plan_tools``, made once per
request by its preparation) says; the same plan sets the grammar of the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from speculative_llm.engine.models.tokenizers import Tokenizer
from speculative_llm.engine.request.tools import ToolPlan
from speculative_llm.types import GenerationRequest, Message

__all__ = ["encode_messages", "encode_request", "template_message"]

_FALLBACK_ROLES = {"system": "System", "user": "User", "assistant": "Assistant", "tool": "Tool"}


def encode_request(
    request: GenerationRequest, tokenizer: Tokenizer, plan: ToolPlan | None
) -> list[int]:
    """The request's prompt token ids (chat template applied to messages).

    Models without a chat template (base models such as gemma3-270m) get a plain
    transcript: ``User: ...`` lines followed by ``Assistant:``. A request with tools is
    encoded as its tool ``plan`` (``tools.plan_tools``) says.

    Raises:
        ConfigError: Text that cannot be encoded (a lone surrogate) or a chat template
            that refuses the messages.
    """
    if plan is not None:
        return encode_messages(tokenizer, plan.messages, plan.template_tools)
    if request.messages is None:
        assert request.prompt is not None
        return tokenizer.encode(request.prompt)
    return encode_messages(tokenizer, request.messages, None)


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
