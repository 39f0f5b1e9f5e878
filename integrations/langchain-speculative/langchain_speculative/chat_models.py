"""``ChatSpeculative``: a LangChain chat model over any speculative-llm backend."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from operator import itemgetter
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.language_models.model_profile import ModelProfile
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.base import OutputParserLike
from langchain_core.output_parsers.openai_tools import (
    JsonOutputKeyToolsParser,
    PydanticToolsParser,
)
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import BaseModel
from pydantic.v1 import BaseModel as BaseModelV1

from langchain_speculative._convert import (
    to_ai_message,
    to_core_messages,
    to_core_tool_choice,
    to_core_tools,
    to_message_chunk,
)
from langchain_speculative._params import SpeculativeParams
from speculative_llm.backends.registry import IN_PROCESS_BACKENDS, TOOL_CAPABLE_BACKENDS
from speculative_llm.errors import ConfigError, UnsupportedFeatureError
from speculative_llm.json_tools import (
    as_json_tool_request,
    json_tool_completion,
    warn_untyped_parameters,
)
from speculative_llm.types import GenerationRequest

__all__ = ["ChatSpeculative"]

StructuredOutputMethod = Literal["json_schema", "function_calling", "json_mode"]
ToolCallingMode = Literal["native", "json_schema"]


class ChatSpeculative(SpeculativeParams, BaseChatModel):
    """Chat model that decodes speculatively and reports how well it went.

    Every ``AIMessage`` carries ``usage_metadata`` and ``response_metadata`` with
    ``model_name``, ``finish_reason`` and ``speculative`` (``SpecStats.to_dict()``:
    drafted and accepted tokens, acceptance rate, tokens per second...). With
    ``token_provenance=True`` messages and streamed chunks also carry
    ``response_metadata["speculative_tokens"]``: each token's text and provenance
    (``draft`` = proposed by the drafter and accepted, ``target``, ``unknown``), so a UI
    can colour accepted draft tokens. Fields this class does not name reach the server's
    request body: ``model_kwargs={...}`` and any other per-call keyword argument.

    Setup:
        The README's install command with the extras ``langchain,local`` for the
        in-process engine (it builds llama.cpp once), or ``langchain`` alone plus a
        running server (llama-server, vLLM...).

    Instantiate:
        .. code-block:: python

            from langchain_speculative import ChatSpeculative

            chat = ChatSpeculative(
                backend="local",
                model="smollm2-135m",
                # k is the longest draft: the engine drafts only what pays.
                speculative={"method": "ngram", "num_speculative_tokens": 12},
                max_tokens=128,
            )
            # or a llama-server started with --jinja (tools) and speculative flags:
            chat = ChatSpeculative(backend="llamacpp", base_url="http://127.0.0.1:8080")

    Invoke:
        .. code-block:: python

            message = chat.invoke("Repeat this line: the quick brown fox")
            message.response_metadata["speculative"]["acceptance_rate"]

    Stream:
        .. code-block:: python

            chat = ChatSpeculative(backend="local", token_provenance=True)
            for chunk in chat.stream("Tell me a story"):
                for token in chunk.response_metadata.get("speculative_tokens", []):
                    print(token["provenance"], token["text"])

    Tools (server backends that can call tools):
        .. code-block:: python

            chat_with_tools = chat.bind_tools([get_weather])
            chat_with_tools.invoke("Weather in Paris?").tool_calls

            # A small model, or a chat template that renders no tools: constrain the answer
            # to a JSON call with the server's grammar instead.
            chat = ChatSpeculative(backend="llamacpp", base_url=url, tool_calling="json_schema")

    Raises at construction:
        ConfigError: Unknown backend or parameter, bad ``speculative`` dict, a method the
            backend cannot run, a server backend without ``base_url``.
        ModelNotFoundError: The model cannot be found.
    """

    tool_calling: ToolCallingMode = "native"
    """How bound tools reach the model. ``native``: the server's tool calling (its chat
    template shows the tools, it parses the calls). ``json_schema``: the tools are described
    in a system message and the answer is constrained by ``response_format`` to one JSON
    call (or answer), which works with templates that render no tools and with small
    models; ``speculative_tokens`` then hold the JSON the model wrote."""

    def __init__(self, **data: Any) -> None:
        """Build the backend and check the configuration (see the class docstring)."""
        super().__init__(**data)
        # BaseChatModel resolves the profile before the backend exists; resolve it now.
        if self.profile is None:
            self.profile = self._resolve_model_profile()

    # ---- identification ----------------------------------------------------------------------

    @property
    def _llm_type(self) -> str:
        return "speculative-chat"

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return self._ls_params("chat", stop, **kwargs)

    def _resolve_model_profile(self) -> ModelProfile | None:
        caps = self._setup.backend.capabilities
        profile = ModelProfile(
            text_inputs=True,
            text_outputs=True,
            image_inputs=False,
            audio_inputs=False,
            video_inputs=False,
            pdf_inputs=False,
            tool_calling=caps.tool_calling,
            tool_choice=caps.tool_calling,
            # Calls come in pieces from servers that stream them; in json_schema mode
            # the JSON is parsed whole, so the call comes whole on the last chunk.
            tool_call_streaming=caps.tool_call_streaming and self.tool_calling == "native",
            structured_output=caps.structured_output,
            temperature=True,
        )
        # An in-process backend knows its model without a network round trip.
        if self._setup.backend.name in IN_PROCESS_BACKENDS:
            info = self._setup.backend.model_info()
            if info.context_window:
                profile["max_input_tokens"] = info.context_window
            if info.max_output_tokens:
                profile["max_output_tokens"] = info.max_output_tokens
        return profile

    # ---- generation ------------------------------------------------------------------------

    def _chat_request(
        self, messages: list[BaseMessage], stop: list[str] | None, **kwargs: Any
    ) -> tuple[GenerationRequest, bool]:
        """The request, and whether its answer is a JSON tool call to parse (json_schema)."""
        request = self._build_request(messages=to_core_messages(messages), stop=stop, **kwargs)
        json_tools = False
        if self.tool_calling == "json_schema":
            request, json_tools = as_json_tool_request(request)
        # The backend checks the request (Backend.stream's contract), once.
        return request, json_tools

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request, json_tools = self._chat_request(messages, stop, **kwargs)
        completion = self.client.generate(request)
        if json_tools:
            completion = json_tool_completion(completion)
        return ChatResult(
            generations=[
                to_ai_message(
                    completion,
                    model_name=self._response_model_name(request),
                    provenance=self.token_provenance,
                )
            ]
        )

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        request, json_tools = self._chat_request(messages, stop, **kwargs)
        completion = await self.client.agenerate(request)
        if json_tools:
            completion = json_tool_completion(completion)
        return ChatResult(
            generations=[
                to_ai_message(
                    completion,
                    model_name=self._response_model_name(request),
                    provenance=self.token_provenance,
                )
            ]
        )

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        # LangChain fires on_llm_new_token for every chunk itself: only yield here.
        request, json_tools = self._chat_request(messages, stop, **kwargs)
        model_name = self._response_model_name(request)
        for chunk in self._chunks(request, json_tools=json_tools):
            yield to_message_chunk(chunk, model_name=model_name, provenance=self.token_provenance)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        request, json_tools = self._chat_request(messages, stop, **kwargs)
        model_name = self._response_model_name(request)
        async for chunk in self._achunks(request, json_tools=json_tools):
            yield to_message_chunk(chunk, model_name=model_name, provenance=self.token_provenance)

    # ---- tools and structured output -------------------------------------------------------

    def _require(self, feature: Literal["tool_calling", "structured_output"], what: str) -> None:
        caps = self.client.capabilities
        if getattr(caps, feature):
            return
        raise UnsupportedFeatureError(
            f"Backend {self.client.name!r} cannot do {what}. Use a backend that can: "
            f"{', '.join(TOOL_CAPABLE_BACKENDS)}, for example "
            "ChatSpeculative(backend='llamacpp', base_url='http://127.0.0.1:8080') against a "
            "llama-server (add tool_calling='json_schema' when the model's chat template "
            "renders no tools)."
        )

    def bind_tools(
        self,
        tools: Sequence[builtins.dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | bool | builtins.dict[str, Any] | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools (LangChain tools, functions, pydantic classes or OpenAI dicts).

        Args:
            tools: The tools the model may call.
            tool_choice: ``"auto"``, ``"any"``/``True`` (must call one), ``"none"``, or
                a tool name (only that tool is offered, and it must be called).
            strict: Ask the server to follow the schemas exactly (OpenAI ``strict``).
            **kwargs: Further per-call options, sent with every request.

        A tool whose parameters declare no type is warned about once (``UserWarning``):
        the model may write any JSON value there.

        Raises:
            UnsupportedFeatureError: The backend cannot call tools (named alternatives).
            ConfigError: ``tool_choice`` names a tool that is not bound.
        """
        if self.tool_calling == "json_schema":
            self._require("structured_output", "tool calling in json_schema mode")
        else:
            self._require("tool_calling", "tool calling")
        formatted, choice = to_core_tool_choice(tool_choice, to_core_tools(tools, strict=strict))
        warn_untyped_parameters(formatted)
        if choice is not None:
            kwargs["tool_choice"] = choice
        return super().bind(tools=list(formatted), **kwargs)

    def with_structured_output(
        self,
        schema: builtins.dict[str, Any] | type,
        *,
        include_raw: bool = False,
        method: StructuredOutputMethod | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, builtins.dict[str, Any] | BaseModel]:
        """Return a runnable whose output follows ``schema``.

        Args:
            schema: A pydantic class, TypedDict, JSON schema or OpenAI tool schema.
            include_raw: Return ``{"raw", "parsed", "parsing_error"}`` instead.
            method: ``json_schema`` (the server constrains decoding with
                ``response_format``), ``function_calling`` (a forced tool call) or
                ``json_mode``. Default: ``json_schema`` where the backend supports
                structured output, else ``function_calling``.
            strict: Ask the server to follow the schema exactly.
            **kwargs: Not supported; present for signature compatibility.

        Raises:
            UnsupportedFeatureError: The backend supports neither structured output nor
                tool calling (or not the chosen method).
            ConfigError: Unknown ``method`` or unexpected keyword arguments.
        """
        if kwargs:
            raise ConfigError(
                f"Unexpected arguments to with_structured_output: {', '.join(sorted(kwargs))}.",
                field=next(iter(kwargs)),
            )
        caps = self.client.capabilities
        if method is None:
            method = "json_schema" if caps.structured_output else "function_calling"
        is_pydantic = isinstance(schema, type) and (
            is_basemodel_subclass(schema) or issubclass(schema, BaseModelV1)
        )
        structured_format = {"kwargs": {"method": method}, "schema": schema}
        parser: OutputParserLike[Any]
        if method == "function_calling":
            if self.tool_calling == "native":
                self._require("tool_calling", "tool calling (method='function_calling')")
            tool_name = convert_to_openai_tool(schema)["function"]["name"]
            llm = self.bind_tools(
                [schema],
                tool_choice=tool_name,
                strict=strict,
                ls_structured_output_format=structured_format,
            )
            parser = (
                PydanticToolsParser(tools=[schema], first_tool_only=True)  # type: ignore[list-item]
                if is_pydantic
                else JsonOutputKeyToolsParser(key_name=tool_name, first_tool_only=True)
            )
        elif method in ("json_schema", "json_mode"):
            self._require("structured_output", f"structured output (method={method!r})")
            llm = self.bind(
                response_format=_response_format(schema, method=method, strict=strict),
                ls_structured_output_format=structured_format,
            )
            parser = (
                PydanticOutputParser(pydantic_object=schema)  # type: ignore[arg-type]
                if is_pydantic
                else JsonOutputParser()
            )
        else:
            raise ConfigError(
                f"Unknown structured output method {method!r}; use 'json_schema', "
                "'function_calling' or 'json_mode'.",
                field="method",
            )
        if include_raw:
            parse_raw = RunnablePassthrough.assign(
                parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
            )
            no_parse = RunnablePassthrough.assign(parsed=lambda _: None)
            return RunnableMap(raw=llm) | parse_raw.with_fallbacks(
                [no_parse], exception_key="parsing_error"
            )
        return llm | parser


def _response_format(
    schema: builtins.dict[str, Any] | type, *, method: str, strict: bool | None
) -> builtins.dict[str, Any]:
    """OpenAI ``response_format`` for a schema (``json_object`` in JSON mode)."""
    if method == "json_mode":
        return {"type": "json_object"}
    json_schema = convert_to_json_schema(schema)
    spec: builtins.dict[str, Any] = {
        "name": json_schema.get("title", "response"),
        "schema": json_schema,
    }
    if json_schema.get("description"):
        spec["description"] = json_schema["description"]
    if strict is not None:
        spec["strict"] = strict
    return {"type": "json_schema", "json_schema": spec}
