"""Structured prediction through ``response_format`` (JSON schema) on backends that honour it.

LlamaIndex's default for a function-calling LLM is a forced tool call. Servers constrain
``response_format={"type": "json_schema", ...}`` with a grammar (llama-server, vLLM,
SGLang) while some ignore ``tool_choice="required"`` (llama-server b11434 with a ChatML
tool template answered in prose), so a JSON-schema answer is the reliable path, as
OpenAI's own LlamaIndex integration prefers structured outputs where the model has them.
"""

from __future__ import annotations

from typing import Any, TypeVar

from llama_index.core.base.llms.types import ChatMessage, ChatResponse
from llama_index.core.bridge.pydantic import BaseModel, ValidationError
from llama_index.core.prompts.base import BasePromptTemplate

__all__ = ["json_schema_format", "parse_structured", "structured_messages"]

Model = TypeVar("Model", bound=BaseModel)


def json_schema_format(output_cls: type[BaseModel]) -> dict[str, Any]:
    """The OpenAI ``response_format`` asking for an instance of ``output_cls``."""
    return {
        "type": "json_schema",
        "json_schema": {"name": output_cls.__name__, "schema": output_cls.model_json_schema()},
    }


def structured_messages(
    prompt: BasePromptTemplate, llm: Any, prompt_args: dict[str, Any]
) -> list[ChatMessage]:
    """The prompt's chat messages, formatted the way LlamaIndex formats them for ``llm``."""
    return list(prompt.format_messages(llm=llm, **prompt_args))


def parse_structured(output_cls: type[Model], response: ChatResponse) -> Model:
    """Validate the JSON answer against ``output_cls``.

    Raises:
        ValueError: The answer is not a valid instance; the message quotes it and says
            the likely cause (a token budget too small to finish the object).
    """
    text = (response.message.content or "").strip()
    try:
        return output_cls.model_validate_json(text)
    except ValidationError as error:
        raw = response.raw if isinstance(response.raw, dict) else {}
        finish = raw.get("finish_reason")
        hint = (
            " The answer stopped at max_tokens: raise max_tokens."
            if finish == "length"
            else " Check that the server honours response_format (json_schema)."
        )
        raise ValueError(
            f"The model's answer is not a valid {output_cls.__name__}: {error.error_count()} "
            f"validation error(s), first: {error.errors()[0]['msg']}. Answer: {text[:200]!r}."
            f"{hint}"
        ) from error
