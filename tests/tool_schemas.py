"""Tool schemas the tests offer to models and servers."""

from __future__ import annotations

from typing import Any

__all__ = ["ADD_TOOL"]

ADD_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers and return the sum.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
"""OpenAI's form of a tool that adds two integers (the forced-tool-choice tests)."""
