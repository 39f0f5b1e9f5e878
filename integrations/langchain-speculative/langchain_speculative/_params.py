"""Parameters shared by ``ChatSpeculative`` and ``SpeculativeLLM``, and request building."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Literal

from langchain_core.language_models.base import LangSmithParams
from langchain_core.utils import secret_from_env
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, ValidationError

from langchain_speculative._convert import with_tool_call_deltas
from speculative_llm.arguments import (
    config_error_from,
    reject_own_parameters,
    reject_unknown_arguments,
    request_body,
)
from speculative_llm.backends.base import Backend, check_request_fields
from speculative_llm.backends.builder import BackendSetup, build_backend
from speculative_llm.backends.secret_options import (
    hide_base_url_credentials,
    protect_backend_options,
    reveal_base_url,
)
from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError, UnsupportedFeatureError
from speculative_llm.json_tools import json_tool_final_chunk
from speculative_llm.stats import SpecStats
from speculative_llm.types import Chunk, GenerationRequest, Message

__all__ = ["API_KEY_ENV", "SpeculativeParams"]

API_KEY_ENV = "SPECULATIVE_LLM_API_KEY"
"""Environment variable read for ``api_key`` when it is not given."""

# Per-call keyword arguments mapped onto GenerationRequest fields.
_REQUEST_KWARGS = ("temperature", "max_tokens", "top_p", "top_k", "seed")
# Every per-call keyword argument a model maps itself (``stream`` is LangChain's switch);
# any other goes to the server's request body, as ChatOpenAI and ChatOllama send it.
_CALL_KWARGS = (
    *_REQUEST_KWARGS,
    "speculative",
    "model",
    "tools",
    "tool_choice",
    "response_format",
    "prediction",
    "extra_body",
    "stream",
)


class SpeculativeParams(BaseModel):
    """Configuration common to the chat and the text-completion model.

    The backend is built (and the configuration checked) when the model is
    constructed, so a bad configuration fails at once with a ``ConfigError``.
    """

    model_config = ConfigDict(populate_by_name=True, arbitrary_types_allowed=True)

    backend: str | Backend = "local"
    """Backend name (``local``, ``llamacpp``, ``vllm``, ``sglang``, ``lmstudio``, ``tgi``,
    ``openai``) or a ``Backend`` instance (shared, not closed by this model)."""

    model_name: str | None = Field(default=None, alias="model")
    """Model: for ``local`` a Hugging Face id, directory, ``.gguf`` file or packaged alias
    (default ``smollm2-135m``); for servers the served model's name."""

    speculative: Any = None
    """Speculative configuration: a ``SpecConfig``, a dict such as
    ``{"method": "ngram", "num_speculative_tokens": 12}``, a method name, or None for the
    backend's default. On the local engine every method drafts cost-aware by default
    (k is the longest draft; only drafts that pay are verified); ``cost_aware=False``
    asks for fixed drafts of k tokens."""

    backend_options: dict[str, Any] = Field(default_factory=dict)
    """Extra constructor options of the named backend (``device``, ``dtype``, ``endpoint``,
    ``stream_timeout``...). ``api_key`` and the values of ``headers`` are kept as
    ``SecretStr`` (masked in ``repr``, dumps and traces)."""

    base_url: str | None = None
    """Server URL for server backends, e.g. ``http://127.0.0.1:8080``. A ``user:password@``
    in it is kept apart as a secret (sent as basic authentication, never shown)."""

    api_key: SecretStr | None = Field(default_factory=secret_from_env(API_KEY_ENV, default=None))
    """API key sent to server backends; read from ``SPECULATIVE_LLM_API_KEY`` if not given."""

    temperature: float | None = None
    """Sampling temperature; 0 is greedy. None uses the core default (greedy)."""

    max_tokens: int | None = None
    """Most tokens to generate. None uses the core default (256)."""

    top_p: float | None = None
    """Nucleus sampling mass in (0, 1]."""

    top_k: int | None = None
    """Keep the k most likely tokens (0 keeps all)."""

    seed: int | None = None
    """Random seed for reproducible sampling."""

    stop: list[str] | None = Field(default=None, alias="stop_sequences")
    """Strings that end the generation."""

    timeout: float | None = None
    """Deadline of one call in seconds (server backends; default 120, see the backends guide)."""

    max_retries: int | None = None
    """Retries of failed requests (server backends)."""

    streaming: bool = False
    """Whether ``invoke`` streams internally (callbacks then see every token)."""

    model_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Fields added to every request body as they are, for parameters this class does not
    name (``{"min_p": 0.05, "parallel_tool_calls": False}``), as ``ChatOpenAI`` takes
    them. Per-call keyword arguments and ``extra_body`` win over them. The in-process
    engine refuses fields it cannot honour (it takes ``cache_prompt``)."""

    token_provenance: bool = False
    """Whether messages carry ``response_metadata["speculative_tokens"]``, the text and
    provenance of every token. Off by default: the list grows with the answer and every
    message keeps it (LangGraph checkpoints, traces); the statistics are there either way."""

    _setup: BackendSetup = PrivateAttr()
    _url_credentials: SecretStr | None = PrivateAttr(default=None)

    def __init__(self, **data: Any) -> None:
        """Validate the parameters and build the backend.

        Raises:
            ConfigError: Unknown parameter, bad ``speculative`` value, unknown backend,
                missing ``base_url``, or invalid sampling values.
            ModelNotFoundError: The model cannot be found.
        """
        try:
            reject_unknown_arguments(type(self), data)
        except ConfigError as error:
            raise ConfigError(
                f"{error} Fields for the server's request body go in model_kwargs={{...}}.",
                field=error.field,
            ) from None
        # Secrets leave the fields that repr(), dumps and tracers show (as ChatOpenAI's key).
        credentials = None
        if "base_url" in data:
            data["base_url"], credentials = hide_base_url_credentials(data["base_url"])
        if isinstance(data.get("backend_options"), dict):
            data["backend_options"] = protect_backend_options(data["backend_options"])
        try:
            super().__init__(**data)
        except ValidationError as error:  # a value of the wrong type: say which
            raise config_error_from(error, type(self)) from None
        self._url_credentials = credentials
        self._setup = build_backend(
            self.backend,
            model=self.model_name,
            speculative=self.speculative,
            options=self.backend_options,
            base_url=reveal_base_url(self.base_url, self._url_credentials),
            api_key=self.api_key.get_secret_value() if self.api_key is not None else None,
            timeout=self.timeout,
            max_retries=self.max_retries,
        )
        # Check the sampling values and body fields now rather than on the first call.
        try:
            own = {*_CALL_KWARGS, *SpeculativeParams.model_fields, "stop"}
            reject_own_parameters(
                self.model_kwargs, own, argument="model_kwargs", where=type(self).__name__
            )
            check_request_fields(self.client.name, self.client.capabilities, self.model_kwargs)
            self._build_request(prompt="check", messages=None, stop=None)
        except (ConfigError, UnsupportedFeatureError):
            if self._setup.owned:
                self._setup.backend.close()
            raise

    @property
    def lc_secrets(self) -> dict[str, str]:
        """Secret fields and the environment variables LangChain's loader reads them from."""
        return {"api_key": API_KEY_ENV}

    # ---- accessors -------------------------------------------------------------------------

    @property
    def client(self) -> Backend:
        """The backend this model sends its requests to."""
        return self._setup.backend

    @property
    def spec_config(self) -> SpecConfig | None:
        """The validated speculative configuration (None: the backend's default)."""
        return SpecConfig.from_value(self.speculative)

    @property
    def resolved_model_name(self) -> str:
        """The model name: the one given, else the backend's."""
        return self.model_name or self._setup.request_model or self._setup.backend.model_name

    @property
    def _identifying_params(self) -> dict[str, Any]:
        """What identifies this model in LangChain's caches and traces."""
        spec = self.spec_config
        return {
            "backend": self._setup.backend.name,
            "model_name": self.resolved_model_name,
            "speculative": spec.to_dict() if spec is not None else None,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "model_kwargs": self.model_kwargs,
        }

    def _response_model_name(self, request: GenerationRequest) -> str:
        """The model an answer names: the request's, else this model's."""
        return request.model or self.resolved_model_name

    def _missing_final_chunk(self) -> Chunk:
        """The closing chunk of a stream the backend ended without one (stats unavailable)."""
        stats = SpecStats.unavailable(
            self.client.name, note="the backend ended its stream without final statistics"
        )
        return Chunk(final=True, stats=stats)

    def _chunks(self, request: GenerationRequest, *, json_tools: bool = False) -> Iterator[Chunk]:
        """The backend's stream of ``request``, always ending with a final chunk.

        With ``json_tools`` the constrained answer is parsed whole and comes as one chunk:
        the tool call, or the answer's text without its JSON envelope. Tool calls always
        arrive as ``tool_call_deltas`` (``with_tool_call_deltas``). The backend's stream is
        closed when this one is (its HTTP response with it).
        """
        stream = self.client.stream(request)
        if json_tools:
            name = self._response_model_name(request)
            yield json_tool_final_chunk(stream, model=name, backend=self.client.name)
            return
        saw_final = saw_tool_call_deltas = False
        try:
            for chunk in stream:
                if chunk.is_progress:
                    continue  # a long prompt's progress: no message chunk, no token event
                saw_final = saw_final or chunk.final
                yield with_tool_call_deltas(chunk, streamed=saw_tool_call_deltas)
                saw_tool_call_deltas = saw_tool_call_deltas or bool(chunk.tool_call_deltas)
        finally:
            _close(stream)
        if not saw_final:
            yield self._missing_final_chunk()

    async def _achunks(
        self, request: GenerationRequest, *, json_tools: bool = False
    ) -> AsyncIterator[Chunk]:
        """Async twin of ``_chunks``."""
        stream = self.client.astream(request)
        if json_tools:
            name = self._response_model_name(request)
            chunks = [chunk async for chunk in stream]
            yield json_tool_final_chunk(chunks, model=name, backend=self.client.name)
            return
        saw_final = saw_tool_call_deltas = False
        try:
            async for chunk in stream:
                if chunk.is_progress:
                    continue  # a long prompt's progress: no message chunk, no token event
                saw_final = saw_final or chunk.final
                yield with_tool_call_deltas(chunk, streamed=saw_tool_call_deltas)
                saw_tool_call_deltas = saw_tool_call_deltas or bool(chunk.tool_call_deltas)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        if not saw_final:
            yield self._missing_final_chunk()

    def _ls_params(
        self, model_type: Literal["chat", "llm"], stop: list[str] | None, **kwargs: Any
    ) -> LangSmithParams:
        """LangSmith's standard parameters; a per-call ``model`` wins over the configured one."""
        params = LangSmithParams(
            ls_provider="speculative",
            ls_model_name=kwargs.get("model") or self.resolved_model_name,
            ls_model_type=model_type,
        )
        temperature = kwargs.get("temperature", self.temperature)
        if temperature is not None:
            params["ls_temperature"] = temperature
        max_tokens = kwargs.get("max_tokens", self.max_tokens)
        if max_tokens is not None:
            params["ls_max_tokens"] = max_tokens
        if stop_sequences := stop or self.stop:
            params["ls_stop"] = stop_sequences
        return params

    # ---- requests --------------------------------------------------------------------------

    def _build_request(
        self,
        *,
        messages: Sequence[Message] | None,
        prompt: str | None = None,
        stop: list[str] | None,
        **kwargs: Any,
    ) -> GenerationRequest:
        """Build a request from the model's parameters and per-call keyword arguments.

        Per-call ``temperature``, ``max_tokens``, ``top_p``, ``top_k``, ``seed``,
        ``model``, ``speculative``, ``tools``, ``tool_choice``, ``response_format`` and
        ``prediction`` (Predicted Outputs, as ``ChatOpenAI`` takes it) override the
        model's. Every other keyword argument is a field of the request body
        (``GenerationRequest.extra``), as ``ChatOpenAI`` sends it: ``model_kwargs``, then
        the call's other arguments, then ``extra_body={...}``, each winning over the one
        before.

        Raises:
            ConfigError: A misspelt keyword argument (``temprature``), or a value of the
                wrong type (the error names it).
        """
        extra = request_body(kwargs, _CALL_KWARGS, self.model_kwargs, where=type(self).__name__)
        options: dict[str, Any] = {}
        for name in _REQUEST_KWARGS:
            value = kwargs.pop(name, getattr(self, name))
            if value is not None:
                options[name] = value
        stop_sequences = stop if stop is not None else self.stop
        if stop_sequences:
            options["stop"] = stop_sequences
        spec = (
            SpecConfig.from_value(kwargs.pop("speculative"))
            if "speculative" in kwargs
            else self._setup.request_spec
        )
        model = kwargs.pop("model", None) or self._setup.request_model
        tools = kwargs.pop("tools", None)
        tool_choice = kwargs.pop("tool_choice", None)
        response_format = kwargs.pop("response_format", None)
        prediction = kwargs.pop("prediction", None)
        return GenerationRequest(
            messages=tuple(messages) if messages is not None else None,
            prompt=prompt,
            tools=tools or None,
            tool_choice=tool_choice,
            response_format=response_format,
            prediction=prediction,
            spec=spec,
            model=model,
            extra=extra,
            **options,
        )

    # ---- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Close the backend if this model built it (a ``Backend`` passed in is left open)."""
        if self._setup.owned:
            self._setup.backend.close()

    async def aclose(self) -> None:
        """Async twin of ``close``."""
        if self._setup.owned:
            await self._setup.backend.aclose()


def _close(stream: Iterator[Chunk]) -> None:
    """Close a backend's stream (a generator frees its connection or engine lock)."""
    close = getattr(stream, "close", None)
    if close is not None:
        close()
