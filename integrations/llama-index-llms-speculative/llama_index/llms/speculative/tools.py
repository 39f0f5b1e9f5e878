"""Function calling for ``Speculative``: LlamaIndex tools in, tool selections out (no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, MessageRole, ToolCallBlock
from llama_index.core.llms.llm import ToolSelection

from llama_index.llms.speculative.convert import tool_selections
from llama_index.llms.speculative.streamed_calls import is_in_progress, partial_tool_selections
from speculative_llm.backends.base import TOOL_CAPABLE_BACKENDS
from speculative_llm.errors import ConfigError, UnsupportedFeatureError
from speculative_llm.json_tools import warn_untyped_parameters

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

__all__ = [
    "force_tool",
    "keep_first_tool_call",
    "no_tool_calling",
    "requested_tools",
    "tool_chat_kwargs",
]


def tool_chat_kwargs(
    tools: Sequence[BaseTool],
    user_msg: str | ChatMessage | None,
    chat_history: list[ChatMessage] | None,
    tool_required: bool,
    kwargs: dict[str, Any],
) -> dict[str, Any]:
    """The ``chat`` arguments that offer ``tools`` (OpenAI definitions) after the history.

    ``tool_choice`` defaults to ``required`` when ``tool_required``, else ``auto``; the
    caller's history is not modified. A tool whose parameters declare no type is warned
    about once (``UserWarning``): the model may write any JSON value there.
    """
    tool_specs = [tool.metadata.to_openai_tool(skip_length_check=True) for tool in tools]
    warn_untyped_parameters(tool_specs)
    messages = list(chat_history or [])
    if isinstance(user_msg, str):
        messages.append(ChatMessage(role=MessageRole.USER, content=user_msg))
    elif user_msg is not None:
        messages.append(user_msg)
    tool_choice = kwargs.pop("tool_choice", None)
    if tool_choice is None and tool_specs:
        tool_choice = "required" if tool_required else "auto"
    return {
        "messages": messages,
        "tools": tool_specs or None,
        "tool_choice": tool_choice if tool_specs else None,
        **kwargs,
    }


def requested_tools(response: ChatResponse, *, error_on_no_tool_call: bool) -> list[ToolSelection]:
    """The tool calls of a response as ``ToolSelection``s.

    A streamed response before the last holds the calls so far: their arguments are read
    leniently (partial JSON completed, ``{}`` while nothing parses), as
    ``llama-index-llms-openai`` reads them. Any other response's are parsed strictly.

    Raises:
        ValueError: The response calls no tool and ``error_on_no_tool_call`` is True.
        MalformedResponseError: A complete response's call has arguments that are not a
            JSON object.
    """
    if is_in_progress(response):
        selections = partial_tool_selections(response.message)
    else:
        selections = tool_selections(response.message)
    if not selections and error_on_no_tool_call:
        raw = response.raw if isinstance(response.raw, dict) else {}
        if raw.get("finish_reason") == "length":
            raise ValueError(_cut_call_message(response.message.content or "", raw))
        raise ValueError(
            "Expected at least one tool call, but the model answered with text only: "
            f"{(response.message.content or '')[:200]!r}. Pass tool_required=True (or "
            "tool_choice='required') to force a call."
        )
    return selections


def _cut_call_message(text: str, raw: dict[str, Any]) -> str:
    """Why no tool call came: ``max_tokens`` cut the answer (finish reason ``length``)."""
    usage = raw.get("usage")
    used = usage.get("completion_tokens") if isinstance(usage, dict) else None
    spent = f"all {used} tokens of max_tokens" if isinstance(used, int) and used else "max_tokens"
    budget = (
        f"max_tokens={max(2 * used, used + 64)} or more"
        if isinstance(used, int) and used
        else "a larger max_tokens"
    )
    return (
        f"The tool call was cut at max_tokens (finish reason 'length'): the model had spent "
        f"{spent} before the call was complete: {text[:200]!r}. A call needs room for the "
        f"tool's name and every argument: pass {budget} (Speculative(max_tokens=...) or "
        "max_tokens=... with the call)."
    )


def force_tool(
    tools: tuple[dict[str, Any], ...] | None, name: str
) -> tuple[tuple[dict[str, Any], ...], str]:
    """Force a call of the tool ``name``: offer only that tool, with ``tool_choice="required"``.

    Servers differ on OpenAI's named tool choice (llama-server treats it as ``auto``);
    offering one tool and requiring a call means the same everywhere.
    """
    names = [tool.get("function", {}).get("name") for tool in tools or ()]
    if name not in names:
        offered = ", ".join(repr(n) for n in names) or "none"
        raise ConfigError(
            f"tool_choice {name!r} is neither 'auto', 'none' nor 'required', nor the name of a "
            f"tool in this request (tools: {offered}).",
            field="tool_choice",
        )
    return tuple(t for t in tools or () if t.get("function", {}).get("name") == name), "required"


def keep_first_tool_call(message: ChatMessage) -> None:
    """Drop every tool call of ``message`` but the first (in its blocks and kwargs)."""
    seen_call = False
    kept: list[Any] = []
    for block in message.blocks:
        if isinstance(block, ToolCallBlock):
            if seen_call:
                continue
            seen_call = True
        kept.append(block)
    message.blocks = kept
    calls = message.additional_kwargs.get("tool_calls")
    if calls:
        message.additional_kwargs["tool_calls"] = list(calls)[:1]


def no_tool_calling(backend_name: str) -> UnsupportedFeatureError:
    """The error for a backend that cannot call tools: which backends can, and how."""
    return UnsupportedFeatureError(
        f"Backend {backend_name!r} cannot call tools, so Speculative cannot run "
        f"function-calling agents on it. Use a backend that can: "
        f"{', '.join(TOOL_CAPABLE_BACKENDS)}; for example "
        "Speculative(backend='llamacpp', base_url=...) with a llama-server started "
        "with --jinja (or tool_calling='json_schema' when the model's chat template "
        "renders no tools)."
    )
