"""``Speculative``: a LlamaIndex LLM that decodes speculatively through any backend."""

from __future__ import annotations

from collections.abc import (
    AsyncIterator,
    Iterator,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr, SecretStr, ValidationError
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW, DEFAULT_NUM_OUTPUTS
from llama_index.core.llms.callbacks import (
    llm_chat_callback,
    llm_completion_callback,
)
from llama_index.core.llms.llm import ToolSelection
from llama_index_instrumentation import get_dispatcher

from llama_index.llms.speculative.arguments import (
    API_KEY_ENV,
    TOOL_CHOICES,
    Call,
    ToolCallingMode,
    additional_kwargs_of,
    api_key_of,
    check_constructor_values,
    constructor_backend,
    request_options,
    validate_defaults,
)
from llama_index.llms.speculative.convert import (
    StreamAccumulator,
    aresponses_of,
    chat_response,
    completion_response,
    responses_of,
    to_core_messages,
)
from llama_index.llms.speculative.structured import JSONSchemaStructuredLLM
from llama_index.llms.speculative.tools import (
    force_tool,
    keep_first_tool_call,
    no_tool_calling,
    requested_tools,
    tool_chat_kwargs,
)
from speculative_llm.arguments import (
    config_error_from,
    reject_unknown_arguments,
)
from speculative_llm.backends.base import (
    Backend,
    ModelInfo,
    check_request_fields,
)
from speculative_llm.backends.builder import build_backend
from speculative_llm.backends.secret_options import (
    hide_base_url_credentials,
    protect_backend_options,
    reveal_base_url,
)
from speculative_llm.config import SpecConfig
from speculative_llm.errors import BackendError
from speculative_llm.json_tools import as_json_tool_request, final_chunk_of, json_tool_completion
from speculative_llm.types import Chunk, Completion, GenerationRequest, Message

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

dispatcher = get_dispatcher(__name__)

__all__ = ["API_KEY_ENV", "Speculative"]


class Speculative(JSONSchemaStructuredLLM):
    """A LlamaIndex LLM with speculative decoding and per-request acceptance statistics.

    It generates through a speculative-llm ``Backend``: the in-process engine
    (``"local"``, the default) or a server (``"llamacpp"``, ``"vllm"``, ``"sglang"``,
    ``"lmstudio"``, ``"tgi"``, ``"openai"``). Every response carries the request's
    ``SpecStats`` as a dict in ``additional_kwargs["speculative"]`` and the usage in
    OpenAI form in ``raw["usage"]`` (read by ``TokenCountingHandler``). Streamed
    responses carry the cumulative text, the ``delta`` and, in
    ``additional_kwargs["speculative_tokens"]``, the delta's tokens with their
    provenance (``draft``, ``target`` or ``unknown``).

    Setup:
        ``pip install "speculative-llm[llama-index,local]"`` (add ``llamacpp`` for a
        managed llama-server).

    Instantiate:
        .. code-block:: python

            from llama_index.llms.speculative import Speculative

            llm = Speculative(model="smollm2-135m", speculative={"method": "ngram", "k": 12})
            server_llm = Speculative(
                backend="llamacpp", base_url="http://127.0.0.1:8080", timeout=30, max_retries=2
            )

    Invoke:
        .. code-block:: python

            response = llm.complete("Repeat: the quick brown fox")
            response.additional_kwargs["speculative"]["acceptance_rate"]

    Stream:
        .. code-block:: python

            for step in llm.stream_complete("Count from 1 to 20"):
                print(step.delta, end="")

    Call-time keyword arguments of ``chat``/``complete`` (and their stream and async
    twins): ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop``, ``seed``,
    ``tools``, ``tool_choice``, ``response_format``, ``prediction`` (Predicted Outputs:
    the expected text, or OpenAI's ``{"type": "content", ...}``) and ``speculative`` (a
    ``SpecConfig``, dict or method name; ``"none"`` is the baseline). Any other keyword
    argument is a field of the server's request body, as LlamaIndex's ``OpenAI`` sends
    it (``parallel_tool_calls=False``, ``min_p=0.05``), over ``additional_kwargs`` and
    under ``extra_body={...}``; one that misspells a name above (``max_token``), or a
    value of the wrong type, raises ``ConfigError`` naming it. The in-process engine
    takes ``cache_prompt`` alone and refuses other fields (``UnsupportedFeatureError``).

    Every argument is a keyword, as in LlamaIndex's other LLMs; the backend given
    positionally (``Speculative("llamacpp", ...)``, the first form) still works, with a
    ``DeprecationWarning``.

    Args:
        backend: A backend name (or alias) or a ``Backend`` instance (which stays the
            caller's to close). Built by ``build_backend``, under the same rules as
            LangChain's ``ChatSpeculative``.
        model: Model for the backend to load or ask for (an alias such as
            ``"smollm2-135m"``, a Hugging Face id, a directory or a ``.gguf`` file); with
            a ``Backend`` instance, the model name sent with each request.
        speculative: Speculative configuration (``SpecConfig``, dict or method name);
            None keeps the backend's default. Validated here, at construction.
        base_url: Server URL, for the HTTP backends. A ``user:password@`` in it is kept
            apart as a secret (sent as basic authentication, never shown or serialised).
        api_key: API key of server backends; read from ``SPECULATIVE_LLM_API_KEY`` when
            not given. Kept as a ``SecretStr``, left out of ``to_dict``/``to_json``.
        backend_options: Other options of the backend's constructor (``draft_model``,
            ``dtype``, ``stream_timeout``, ``headers``...). The values of ``headers`` are
            kept as ``SecretStr``.
        timeout: Deadline of a call in seconds, and for a stream the longest wait for its
            next token (server backends; None: 120). Still taken in ``backend_options``;
            given in both with different values, it raises ``ConfigError``.
        max_retries: Retries of a failed request (server backends; None: the backend's).
        additional_kwargs: Fields added to every request body as they are (``{"min_p":
            0.05}``), as LlamaIndex's ``OpenAI`` and ``Ollama`` take them; one that is an
            argument of its own (``temperature``) raises ``ConfigError``.
        temperature: 0 decodes greedily; > 0 samples.
        max_tokens: Most tokens per response; defaults to the smaller of 256 and the
            backend's limit. Also reported as ``metadata.num_output``.
        top_p: Nucleus sampling mass in (0, 1].
        top_k: Keep the k most likely tokens (0 keeps all).
        seed: Random seed for reproducible sampling.
        stop: Strings that end generation.
        context_window: Overrides the context window the backend reports.
        is_chat_model: Whether ``complete`` goes through the chat template (True, the
            default) or sends the raw prompt.
        tool_calling: How tools reach the model. ``native``: the server's tool calling
            (its chat template shows the tools, it parses the calls). ``json_schema``: the
            tools are described in a system message and the answer is constrained by
            ``response_format`` to one JSON call (or answer), as in LangChain's
            ``ChatSpeculative``; it works with templates that render no tools and small
            models.
        **kwargs: Other ``LLM`` fields (``callback_manager``, ``system_prompt``...); any
            other name raises ``ConfigError`` naming it.

    Raises:
        ConfigError: A value is invalid (unknown backend or option, bad speculative
            configuration, out-of-range sampling parameter).
        UnsupportedMethodError: The backend does not support the speculative method (an
            ``UnsupportedFeatureError`` and a ``ConfigError``).
        MissingDependencyError: The backend's extra is not installed.
    """

    backend_name: str = Field(description="Name of the speculative-llm backend.")
    model: str | None = Field(default=None, description="Model the backend loads or asks for.")
    speculative: dict[str, Any] | None = Field(
        default=None, description="Speculative configuration (SpecConfig as a dict)."
    )
    base_url: str | None = Field(
        default=None, description="Server URL of HTTP backends (without credentials)."
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="API key of server backends (a secret: never serialised or shown).",
        exclude=True,
    )
    backend_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Other options passed to the backend's constructor.",
        exclude=True,  # may hold headers with secrets: keep it out of serialisation and events
    )
    timeout: float | None = Field(
        default=None,
        description="Deadline of a call in seconds (server backends); None: 120.",
    )
    max_retries: int | None = Field(
        default=None, description="Retries of a failed request (server backends)."
    )
    additional_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Fields added to every request body as they are (min_p...).",
    )
    temperature: float = Field(default=0.0, description="Sampling temperature; 0 is greedy.")
    max_tokens: int | None = Field(default=None, description="Most tokens per response.")
    top_p: float = Field(default=1.0, description="Nucleus sampling mass.")
    top_k: int = Field(default=0, description="Top-k sampling; 0 keeps all tokens.")
    seed: int | None = Field(default=None, description="Random seed.")
    stop: list[str] = Field(default_factory=list, description="Stop strings.")
    context_window: int | None = Field(
        default=None, description="Context window; None asks the backend."
    )
    is_chat_model: bool = Field(
        default=True, description="Whether complete() applies the chat template."
    )
    tool_calling: ToolCallingMode = Field(
        default="native",
        description="How tools reach the model: native, or json_schema (a constrained answer).",
    )

    _backend: Backend = PrivateAttr()
    _owns_backend: bool = PrivateAttr(default=False)
    _spec: SpecConfig | None = PrivateAttr(default=None)
    _model_info: ModelInfo | None = PrivateAttr(default=None)

    def __init__(
        self,
        *args: Any,
        backend: str | Backend = "local",
        model: str | None = None,
        speculative: SpecConfig | Mapping[str, Any] | str | None = None,
        base_url: str | None = None,
        api_key: str | SecretStr | None = None,
        backend_options: Mapping[str, Any] | None = None,
        timeout: float | None = None,
        max_retries: int | None = None,
        additional_kwargs: Mapping[str, Any] | None = None,
        temperature: float = 0.0,
        max_tokens: int | None = None,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
        context_window: int | None = None,
        is_chat_model: bool = True,
        tool_calling: ToolCallingMode = "native",
        **kwargs: Any,
    ) -> None:
        backend = constructor_backend(args, backend, kwargs)
        reject_unknown_arguments(type(self), kwargs)
        check_constructor_values(tool_calling, context_window)
        spec = SpecConfig.from_value(speculative)
        stop_strings = [stop] if isinstance(stop, str) else list(stop or ())
        # Validate the sampling parameters with the core's own rules before any model loads.
        validate_defaults(max_tokens, temperature, top_p, top_k, stop_strings, seed, spec)
        # Secrets leave the fields that repr(), dumps and events show.
        base_url, url_credentials = hide_base_url_credentials(base_url)
        given_options = protect_backend_options(backend_options)
        key = api_key_of(api_key)
        body_fields = additional_kwargs_of(additional_kwargs)
        setup = build_backend(
            backend,
            model=model,
            base_url=reveal_base_url(base_url, url_credentials),
            api_key=key,
            speculative=spec,
            options=given_options,
            timeout=timeout,
            max_retries=max_retries,
        )
        backend_instance = setup.backend
        try:
            check_request_fields(backend_instance.name, backend_instance.capabilities, body_fields)
            super().__init__(
                backend_name=backend if isinstance(backend, str) else backend_instance.name,
                model=model,
                speculative=spec.to_dict() if spec is not None else None,
                base_url=base_url,
                api_key=key,
                backend_options=given_options,
                timeout=timeout,
                max_retries=max_retries,
                additional_kwargs=body_fields,
                temperature=temperature,
                max_tokens=max_tokens,
                top_p=top_p,
                top_k=top_k,
                seed=seed,
                stop=stop_strings,
                context_window=context_window,
                is_chat_model=is_chat_model,
                tool_calling=tool_calling,
                **kwargs,
            )
        except BaseException as error:
            if setup.owned:
                backend_instance.close()
            if isinstance(error, ValidationError):  # a value of the wrong type: say which
                raise config_error_from(error, type(self)) from None
            raise
        self._backend = backend_instance
        self._owns_backend = setup.owned
        self._spec = spec

    @classmethod
    def class_name(cls) -> str:
        """Name of this class in LlamaIndex's serialisation."""
        return "Speculative"

    # ---- properties ------------------------------------------------------------------

    @property
    def backend(self) -> Backend:
        """The backend this LLM generates with."""
        return self._backend

    @property
    def spec_config(self) -> SpecConfig | None:
        """The speculative configuration sent with every request (None: the backend's)."""
        return self._spec

    @property
    def metadata(self) -> LLMMetadata:
        """Context window and output budget from the backend, tool calling per its capabilities."""
        info = self._model_info
        if info is None:
            try:
                # Asked once: for a server this is an HTTP round trip.
                info = self._model_info = self._backend.model_info()
            except BackendError:
                # LlamaIndex reads metadata before every call (for its events); an
                # unreachable server must fail the call itself, with its own error.
                info = ModelInfo(name=self._backend.model_name)
        return LLMMetadata(
            context_window=self.context_window or info.context_window or DEFAULT_CONTEXT_WINDOW,
            num_output=self._default_max_tokens(info),
            is_chat_model=self.is_chat_model,
            is_function_calling_model=self._calls_tools(),
            model_name=info.name or self._backend.model_name,
            system_role=MessageRole.SYSTEM,
        )

    def to_payload(self) -> dict[str, Any]:
        """What LlamaIndex's LLM events show of this LLM: its metadata and sampling defaults.

        The defaults every request starts from (no secrets) let a request recorder
        (``TraceRecorderHandler``) write a call's parameters without the LLM at hand.
        """
        return {**super().to_payload(), **self._sampling_defaults(), "stop": list(self.stop)}

    def _sampling_defaults(self) -> dict[str, Any]:
        """The request fields every call starts from."""
        return {
            "max_tokens": self.max_tokens or self.metadata.num_output,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "stop": tuple(self.stop),
            "seed": self.seed,
        }

    def _default_max_tokens(self, info: ModelInfo) -> int:
        if self.max_tokens is not None:
            return self.max_tokens
        if info.max_output_tokens:
            return min(DEFAULT_NUM_OUTPUTS, info.max_output_tokens)
        return DEFAULT_NUM_OUTPUTS

    # ---- requests --------------------------------------------------------------------

    def _request(
        self, *, messages: tuple[Message, ...] | None, prompt: str | None, kwargs: dict[str, Any]
    ) -> GenerationRequest:
        """Build the request: the LLM's defaults, overridden by call-time keyword arguments."""
        options, extra = request_options(
            {**self._sampling_defaults(), "spec": self._spec},
            kwargs,
            self.additional_kwargs,
            where=type(self).__name__,
        )
        choice = options.get("tool_choice")
        if isinstance(choice, str) and choice not in TOOL_CHOICES:
            options["tools"], options["tool_choice"] = force_tool(options.get("tools"), choice)
        return GenerationRequest(
            messages=messages, prompt=prompt, model=self.model, extra=extra, **options
        )

    def _prepare(self, request: GenerationRequest) -> Call:
        if self.tool_calling == "json_schema":
            return Call(*as_json_tool_request(request))
        return Call(request, json_tools=False)

    def _chat_request(
        self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]
    ) -> GenerationRequest:
        return self._request(messages=to_core_messages(messages), prompt=None, kwargs=kwargs)

    def _completion_request(
        self, prompt: str, formatted: bool, kwargs: dict[str, Any]
    ) -> GenerationRequest:
        to_prompt: Any = self.completion_to_prompt
        if not formatted and to_prompt is not None:
            prompt = to_prompt(prompt)
        if self.is_chat_model:
            # A chat model answers a bare prompt as one user message, through its template.
            user = (Message(role="user", content=prompt),)
            return self._request(messages=user, prompt=None, kwargs=kwargs)
        return self._request(messages=None, prompt=prompt, kwargs=kwargs)

    def _chat_call(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> Call:
        return self._prepare(self._chat_request(messages, kwargs))

    def _completion_call(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> Call:
        return self._prepare(self._completion_request(prompt, formatted, kwargs))

    def _generate(self, call: Call) -> Completion:
        completion = self._backend.generate(call.request)
        return json_tool_completion(completion) if call.json_tools else completion

    async def _agenerate(self, call: Call) -> Completion:
        completion = await self._backend.agenerate(call.request)
        return json_tool_completion(completion) if call.json_tools else completion

    def _stream(self, call: Call) -> Iterator[Chunk]:
        if call.json_tools:
            # The JSON call is parsed whole: one chunk, once the server has finished.
            yield final_chunk_of(self._generate(call))
            return
        stream = self._backend.stream(call.request)
        try:
            yield from stream
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()

    async def _astream(self, call: Call) -> AsyncIterator[Chunk]:
        if call.json_tools:
            yield final_chunk_of(await self._agenerate(call))
            return
        stream = self._backend.astream(call.request)
        try:
            async for chunk in stream:
                yield chunk
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    def _accumulator(self) -> StreamAccumulator:
        return StreamAccumulator(self._backend.model_name, self._backend.name)

    # ---- chat ------------------------------------------------------------------------

    @llm_chat_callback()  # type: ignore[misc]
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Answer a conversation in one response (stats in ``additional_kwargs``)."""
        return chat_response(self._generate(self._chat_call(messages, kwargs)))

    @llm_chat_callback()  # type: ignore[misc]
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Async twin of ``chat``."""
        return chat_response(await self._agenerate(self._chat_call(messages, kwargs)))

    @llm_chat_callback()  # type: ignore[misc]
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        """Stream the answer: cumulative ``message.content``, new text in ``delta``."""
        call = self._chat_call(messages, kwargs)
        return responses_of(self._stream(call), self._accumulator().chat)

    @llm_chat_callback()  # type: ignore[misc]
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        """Async twin of ``stream_chat``."""
        call = self._chat_call(messages, kwargs)
        return aresponses_of(self._astream(call), self._accumulator().chat)

    # ---- completion ------------------------------------------------------------------

    @llm_completion_callback()  # type: ignore[misc]
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Complete a prompt in one response (stats in ``additional_kwargs``)."""
        call = self._completion_call(prompt, formatted, kwargs)
        return completion_response(self._generate(call))

    @llm_completion_callback()  # type: ignore[misc]
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        """Async twin of ``complete``."""
        call = self._completion_call(prompt, formatted, kwargs)
        return completion_response(await self._agenerate(call))

    @llm_completion_callback()  # type: ignore[misc]
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        """Stream a completion: cumulative ``text``, new text in ``delta``."""
        call = self._completion_call(prompt, formatted, kwargs)
        return responses_of(self._stream(call), self._accumulator().completion)

    @llm_completion_callback()  # type: ignore[misc]
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        """Async twin of ``stream_complete``."""
        call = self._completion_call(prompt, formatted, kwargs)
        return aresponses_of(self._astream(call), self._accumulator().completion)

    # ---- function calling ------------------------------------------------------------

    # ---- structured output (JSONSchemaStructuredLLM) ----------------------------------

    def _honours_response_format(self) -> bool:
        return self._backend.capabilities.structured_output

    # ---- tools -------------------------------------------------------------------------

    def _calls_tools(self) -> bool:
        """Whether tools work: natively, or through ``response_format`` (json_schema)."""
        caps = self._backend.capabilities
        return caps.structured_output if self.tool_calling == "json_schema" else caps.tool_calling

    def _require_tool_calling(self) -> None:
        if not self._calls_tools():
            raise no_tool_calling(self._backend.name)

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Turn LlamaIndex tools into OpenAI tool definitions for ``chat``.

        Raises:
            UnsupportedFeatureError: The backend cannot call tools; the message names
                the backends that can.
        """
        self._require_tool_calling()
        return tool_chat_kwargs(tools, user_msg, chat_history, tool_required, kwargs)

    def _validate_chat_with_tools_response(
        self,
        response: ChatResponse,
        tools: Sequence[BaseTool],
        allow_parallel_tool_calls: bool = False,
        **kwargs: Any,
    ) -> ChatResponse:
        """Keep only the first tool call unless parallel calls are allowed."""
        if not allow_parallel_tool_calls:
            keep_first_tool_call(response.message)
        return response

    def get_tool_calls_from_response(
        self,
        response: ChatResponse,
        error_on_no_tool_call: bool = True,
        **kwargs: Any,
    ) -> list[ToolSelection]:
        """The tool calls of a response as ``ToolSelection``s.

        Raises:
            ValueError: The response calls no tool and ``error_on_no_tool_call`` is True.
        """
        return requested_tools(response, error_on_no_tool_call=error_on_no_tool_call)

    # ---- lifetime --------------------------------------------------------------------

    def close(self) -> None:
        """Close the backend if this LLM created it (a backend passed in stays open)."""
        if self._owns_backend:
            self._backend.close()

    async def aclose(self) -> None:
        """Async twin of ``close``."""
        if self._owns_backend:
            await self._backend.aclose()
