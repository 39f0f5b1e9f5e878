"""Structured prediction through ``response_format`` (JSON schema) on backends that honour it.

LlamaIndex's default for a function-calling LLM is a forced tool call. Servers constrain
``response_format={"type": "json_schema", ...}`` with a grammar (llama-server, vLLM,
SGLang) while some ignore ``tool_choice="required"`` (llama-server b11434; its backend
enforces a forced call through ``response_format`` itself), so a JSON-schema answer is
the direct path, as OpenAI's own LlamaIndex integration prefers structured outputs where
the model has them.
"""

from __future__ import annotations

from typing import Any, TypeVar

from llama_index.core.base.llms.types import ChatMessage, ChatResponse
from llama_index.core.bridge.pydantic import BaseModel, ValidationError
from llama_index.core.instrumentation.events.llm import (
    LLMStructuredPredictEndEvent,
    LLMStructuredPredictStartEvent,
)
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.prompts.base import BasePromptTemplate
from llama_index.core.types import PydanticProgramMode
from llama_index_instrumentation import get_dispatcher

__all__ = [
    "JSONSchemaStructuredLLM",
    "json_schema_format",
    "parse_structured",
    "structured_messages",
]

Model = TypeVar("Model", bound=BaseModel)

dispatcher = get_dispatcher(__name__)


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


class JSONSchemaStructuredLLM(FunctionCallingLLM):
    """A function-calling LLM whose structured prediction asks for a JSON-schema answer.

    Where the subclass's backend honours ``response_format`` (``_honours_response_format``)
    and LlamaIndex's default program mode is set, ``structured_predict`` sends the class's
    JSON schema and validates the answer; otherwise LlamaIndex's own programs run.
    """

    def __init__(self, **data: Any) -> None:
        # Subclasses add fields: keep the constructor open to them, as LLM's is.
        super().__init__(**data)

    def _honours_response_format(self) -> bool:
        """Whether the backend constrains an answer to ``response_format``."""
        raise NotImplementedError

    def _uses_json_schema(self) -> bool:
        """Structured prediction through ``response_format`` rather than a tool call.

        With LlamaIndex's default program mode and a backend that honours
        ``response_format``: servers constrain a JSON-schema answer with a grammar, which
        is more reliable than a forced tool call. ``pydantic_program_mode=FUNCTION`` (or
        ``LLM``) keeps LlamaIndex's own programs.
        """
        return (
            self.pydantic_program_mode == PydanticProgramMode.DEFAULT
            and self._honours_response_format()
        )

    def _start_structured(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None,
        prompt_args: dict[str, Any],
    ) -> tuple[list[ChatMessage], dict[str, Any]]:
        """Announce a structured prediction; its chat messages and keyword arguments."""
        dispatcher.event(
            LLMStructuredPredictStartEvent(
                output_cls=output_cls, template=prompt, template_args=prompt_args
            )
        )
        kwargs = {**(llm_kwargs or {}), "response_format": json_schema_format(output_cls)}
        return structured_messages(prompt, self, prompt_args), kwargs

    def _finish_structured(self, output_cls: type[Model], response: ChatResponse) -> Model:
        """Validate the answer and announce the result."""
        result = parse_structured(output_cls, response)
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    @dispatcher.span  # type: ignore[misc]
    def structured_predict(
        self,
        output_cls: type[Model],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Model:
        """An instance of ``output_cls`` predicted from ``prompt``.

        On backends that honour ``response_format`` the answer is constrained to the
        class's JSON schema; elsewhere LlamaIndex's function-calling program runs.

        Raises:
            ValueError: The answer is not a valid instance (for example cut off by
                ``max_tokens``).
        """
        if not self._uses_json_schema():
            result: Model = super().structured_predict(
                output_cls,
                prompt,  # type: ignore[arg-type]
                llm_kwargs,
                **prompt_args,
            )
            return result
        messages, kwargs = self._start_structured(output_cls, prompt, llm_kwargs, prompt_args)
        return self._finish_structured(output_cls, self.chat(messages, **kwargs))

    @dispatcher.span  # type: ignore[misc]
    async def astructured_predict(
        self,
        output_cls: type[Model],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Model:
        """Async ``structured_predict``."""
        if not self._uses_json_schema():
            awaited: Model = await super().astructured_predict(
                output_cls,
                prompt,  # type: ignore[arg-type]
                llm_kwargs,
                **prompt_args,
            )
            return awaited
        messages, kwargs = self._start_structured(output_cls, prompt, llm_kwargs, prompt_args)
        return self._finish_structured(output_cls, await self.achat(messages, **kwargs))
