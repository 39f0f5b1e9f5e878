"""Tool calls in progress on streamed responses, joined from the stream's pieces (no I/O).

``llama-index-llms-openai`` puts the calls gathered so far on every streamed
``ChatResponse`` (arguments as the JSON text received so far) and reads them leniently;
``Speculative`` does the same with the core's ``Chunk.tool_call_deltas``, so code written
for it (``FunctionAgent``'s ``AgentStream`` events) shows the calls as they grow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, ChatResponse, ToolCallBlock
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.llms.utils import parse_partial_json

from speculative_llm.types import ToolCallDelta
from speculative_llm.types import ToolCallJoiner as CoreToolCallJoiner

__all__ = [
    "IN_PROGRESS_KEY",
    "ToolCallJoiner",
    "is_in_progress",
    "partial_tool_selections",
]

IN_PROGRESS_KEY = "speculative_in_progress"
"""``ChatResponse.additional_kwargs`` key, True on the streamed responses before the last:
their tool calls are incomplete, so their arguments are read leniently."""


@dataclass
class ToolCallJoiner:
    """The calls a stream's ``ToolCallDelta`` pieces have built so far, as LlamaIndex shows them."""

    _joiner: CoreToolCallJoiner = field(default_factory=CoreToolCallJoiner)

    def add(self, deltas: Sequence[ToolCallDelta]) -> None:
        """Add one chunk's pieces to the calls they belong to."""
        for delta in deltas:
            self._joiner.add(delta)

    def blocks(self) -> list[ToolCallBlock]:
        """The calls so far as ``ToolCallBlock``s, arguments as the JSON text received."""
        return [
            ToolCallBlock(
                tool_call_id=call.id or None, tool_name=call.name, tool_kwargs=call.arguments
            )
            for call in self._joiner.calls()
        ]

    def openai_calls(self) -> list[dict[str, Any]]:
        """The calls so far in OpenAI form, for ``additional_kwargs["tool_calls"]``."""
        return [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in self._joiner.calls()
        ]


def is_in_progress(response: ChatResponse) -> bool:
    """Whether ``response`` is a streamed response before the last one."""
    return response.additional_kwargs.get(IN_PROGRESS_KEY) is True


def _lenient_arguments(arguments: Any) -> dict[str, Any]:
    """Arguments that may be cut mid-JSON: what parses so far, else nothing yet."""
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if not isinstance(arguments, str) or not arguments:
        return {}
    try:
        parsed = parse_partial_json(arguments)
    except (ValueError, TypeError, RecursionError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def partial_tool_selections(message: ChatMessage) -> list[ToolSelection]:
    """The tool calls in progress of a streamed message, arguments parsed leniently.

    As ``llama-index-llms-openai`` reads them: a call's arguments are the JSON received so
    far, completed where it was cut (``{"a": 2, "b`` gives ``{"a": 2}``), and ``{}``
    while nothing of them parses.
    """
    blocks = [block for block in message.blocks if isinstance(block, ToolCallBlock)]
    found: list[tuple[str, str, Any]]
    if blocks:
        found = [(b.tool_call_id or "", b.tool_name, b.tool_kwargs) for b in blocks]
    else:
        found = [
            (str(raw.get("id") or ""), str(function.get("name") or ""), function.get("arguments"))
            for raw in message.additional_kwargs.get("tool_calls") or ()
            if isinstance(raw, Mapping) and isinstance(function := raw.get("function"), Mapping)
        ]
    return [
        # Named after the tool while the id is unknown, as complete calls without one are.
        ToolSelection(tool_id=call_id or name, tool_name=name, tool_kwargs=_lenient_arguments(args))
        for call_id, name, args in found
    ]
