"""Core request and response types shared by every backend and framework adapter."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError
from speculative_llm.stats import SpecStats

__all__ = [
    "Chunk",
    "Completion",
    "FinishReason",
    "GenerationRequest",
    "JoinedToolCall",
    "Message",
    "PromptProgress",
    "Provenance",
    "Role",
    "Token",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallJoiner",
    "Usage",
    "check_sampling",
    "encode_utf8",
    "prediction_text",
]

Role = Literal["system", "user", "assistant", "tool"]
Provenance = Literal["draft", "target", "unknown"]
"""Who produced a token: ``draft`` (proposed by the drafter and accepted by the target),
``target`` (the target model: a correction, the bonus token or plain decoding) or
``unknown`` (the backend cannot tell)."""
FinishReason = Literal["stop", "length", "tool_calls", "cancelled"]

_ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")


def encode_utf8(text: str, *, field: str = "prompt", name: str | None = None) -> bytes:
    """``text`` as UTF-8, or a ``ConfigError`` naming where it cannot be encoded.

    Every backend sends or tokenizes text as UTF-8, so requests check it up front.

    Args:
        text: The text.
        field: The field the error names (``ConfigError.field``).
        name: How the message calls the text (default: ``field``).

    Raises:
        ConfigError: The text holds a lone surrogate (half of a UTF-16 pair), which no
            encoding can carry.
    """
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ConfigError(
            f"The {name or field} has a character that cannot be encoded as UTF-8 at position "
            f"{error.start} ({text[error.start : error.end]!r}, a lone surrogate): remove it "
            "or replace it with the character it was meant to be.",
            field=field,
        ) from None


def _check_number(value: object, field: str, meaning: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{field} must be a number ({meaning}), got {value!r}.", field=field)
    return value


def _check_integer(value: object, field: str, meaning: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{field} must be an integer ({meaning}), got {value!r}.", field=field)
    return value


def check_sampling(temperature: object, top_p: object, top_k: object) -> None:
    """Check the sampling options every backend takes: types first, then ranges.

    Raises:
        ConfigError: An option of the wrong type or out of range (named in ``field``).
    """
    temperature = _check_number(temperature, "temperature", "0 = greedy, > 0 samples")
    top_p = _check_number(top_p, "top_p", "a probability mass in (0, 1]")
    top_k = _check_integer(top_k, "top_k", "0 keeps every token")
    if temperature < 0:
        raise ConfigError(
            f"temperature must be >= 0 (0 = greedy), got {temperature}.", field="temperature"
        )
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must lie in (0, 1], got {top_p}.", field="top_p")
    if top_k < 0:
        raise ConfigError(f"top_k must be >= 0 (0 = off), got {top_k}.", field="top_k")


def prediction_text(value: object) -> str | None:
    """The predicted text of a ``prediction``: a string, or OpenAI's content form.

    Example:
        >>> prediction_text({"type": "content", "content": "class User {}"})
        'class User {}'

    Raises:
        ConfigError: ``value`` is neither (or the text is empty).
    """
    if value is None:
        return None
    text = value.get("content") if isinstance(value, Mapping) else value
    if isinstance(value, Mapping) and value.get("type", "content") != "content":
        text = None
    if not isinstance(text, str) or not text:
        raise ConfigError(
            "prediction must be the text the answer is expected to repeat, as a string or "
            f"as {{'type': 'content', 'content': text}}; got {value!r}.",
            field="prediction",
        )
    return text


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call requested by the model.

    Args:
        name: Function name.
        arguments: Parsed JSON arguments.
        id: Call id, echoed back in the ``tool`` message with the result.
    """

    name: str
    arguments: dict[str, Any]
    id: str = ""

    def to_openai(self) -> dict[str, Any]:
        """The call in OpenAI chat format (arguments as a JSON string)."""
        import json

        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a tool call, as a stream brings it.

    The pieces of one call share its ``index``; joined in order, their ``name`` and
    ``arguments`` fragments give the call's name and its arguments' JSON text (as OpenAI
    streams ``delta.tool_calls``). A backend that knows a call only whole sends it as one
    piece.

    Example:
        >>> ToolCallDelta.whole(0, ToolCall("get_weather", {"city": "Paris"}, id="call_1"))
        ToolCallDelta(index=0, id='call_1', name='get_weather', arguments='{"city": "Paris"}')

    Args:
        index: Which call of the answer this piece belongs to (0 for the first).
        id: The call's id, on the piece that brings it (usually the first).
        name: A fragment of the function's name (usually all of it, on the first piece).
        arguments: A fragment of the arguments' JSON text.
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str | None = None

    @classmethod
    def whole(cls, index: int, call: ToolCall) -> ToolCallDelta:
        """A complete call as the one piece that brings it all."""
        import json

        return cls(
            index=index, id=call.id or None, name=call.name, arguments=json.dumps(call.arguments)
        )


@dataclass(slots=True)
class JoinedToolCall:
    """A streamed tool call as its pieces have built it so far (``ToolCallJoiner``).

    Attributes:
        index: Which call of the answer it is.
        id: The first id its pieces gave ("" while none has).
        name: Its name fragments, joined.
        arguments: Its arguments' JSON text fragments, joined (possibly cut mid-JSON).
    """

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(slots=True)
class ToolCallJoiner:
    """Joins ``ToolCallDelta`` pieces by ``index`` into the calls gathered so far.

    A call keeps the first id it is given (some servers repeat it on every piece, or
    send another later); name and argument fragments are appended in order.
    """

    _calls: dict[int, JoinedToolCall] = field(default_factory=dict)

    def get(self, index: int) -> JoinedToolCall | None:
        """The call at ``index`` so far, or None before its first piece."""
        return self._calls.get(index)

    def add(self, delta: ToolCallDelta) -> JoinedToolCall:
        """Add one piece to the call it belongs to; return that call."""
        call = self._calls.setdefault(delta.index, JoinedToolCall(delta.index))
        call.id = call.id or (delta.id or "")
        call.name += delta.name or ""
        call.arguments += delta.arguments or ""
        return call

    def calls(self) -> list[JoinedToolCall]:
        """The calls so far, in index order."""
        return [self._calls[index] for index in sorted(self._calls)]


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message.

    Args:
        role: ``system``, ``user``, ``assistant`` or ``tool``.
        content: Message text.
        tool_calls: Calls requested by an assistant message.
        tool_call_id: For a ``tool`` message, the id of the call it answers.
        name: Optional author or tool name.
    """

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise ConfigError(
                f"Unknown message role {self.role!r}; use one of {', '.join(_ROLES)}.",
                field="role",
            )
        if not isinstance(self.content, str):
            raise ConfigError(
                f"Message content must be a string, got {type(self.content).__name__}.",
                field="content",
            )
        encode_utf8(self.content, field="content", name=f"{self.role} message's content")

    def to_openai(self) -> dict[str, Any]:
        """The message in OpenAI chat format."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One generation request, the same for every backend.

    Give either ``messages`` (chat) or ``prompt`` (plain completion).

    Args:
        messages: Chat messages; the backend applies the model's chat template.
        prompt: Raw text prompt.
        max_tokens: Most tokens to generate (> 0).
        temperature: 0 for greedy decoding, > 0 to sample.
        top_p: Nucleus sampling mass in (0, 1].
        top_k: Keep the k most likely tokens; 0 keeps all.
        stop: Strings that end the generation (not included in the output).
        seed: Random seed for reproducible sampling.
        tools: Tool definitions in OpenAI format.
        tool_choice: ``auto``, ``none``, ``required`` or an OpenAI tool-choice dict.
        response_format: OpenAI ``response_format`` (``json_object`` or ``json_schema``).
        prediction: Predicted Outputs: text the answer is expected to repeat mostly (a file
            being edited), sent as OpenAI's ``prediction`` to backends that take it
            (``capabilities.predicted_outputs``); its tokens serve as the drafts. OpenAI's
            ``{"type": "content", "content": text}`` form is accepted too.
        spec: Speculative configuration; None uses the backend's default;
            ``SpecConfig.baseline()`` turns speculation off.
        model: Model name to send to a server that serves several.
        extra: Backend-specific request fields, passed through unchanged.

    Raises:
        ConfigError: A value is invalid or of the wrong type (``temperature="hot"``), or
            text cannot be encoded as UTF-8 (a lone surrogate: the message names its
            position); the message says which field and how to fix it.
    """

    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    prediction: str | None = None
    spec: SpecConfig | None = None
    model: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ConfigError(
                "Give exactly one of messages (chat) or prompt (completion).", field="messages"
            )
        if self.messages is not None:
            if not isinstance(self.messages, tuple):
                object.__setattr__(self, "messages", tuple(self.messages))
            if not self.messages:
                raise ConfigError("messages is empty: give at least one message.", field="messages")
            if not any(m.content.strip() or m.tool_calls for m in self.messages):
                raise ConfigError(
                    "Every message is empty: give the model some text.", field="messages"
                )
        if self.prompt is not None:
            if not isinstance(self.prompt, str):
                raise ConfigError(
                    f"prompt must be a string, got {type(self.prompt).__name__}.", field="prompt"
                )
            if not self.prompt.strip():
                raise ConfigError("prompt is empty: give the model some text.", field="prompt")
            encode_utf8(self.prompt, field="prompt")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise ConfigError(
                f"max_tokens must be an integer, got {self.max_tokens!r}.", field="max_tokens"
            )
        if self.max_tokens <= 0:
            raise ConfigError(f"max_tokens must be > 0, got {self.max_tokens}.", field="max_tokens")
        check_sampling(self.temperature, self.top_p, self.top_k)
        if self.seed is not None:
            _check_integer(self.seed, "seed", "or None")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        elif not isinstance(self.stop, tuple):
            raise ConfigError(
                f"stop must be a string or a list of strings, got {self.stop!r}.", field="stop"
            )
        if any(not isinstance(s, str) for s in self.stop):
            raise ConfigError(f"stop must be strings, got {list(self.stop)!r}.", field="stop")
        if any(not s for s in self.stop):
            raise ConfigError("stop strings must not be empty.", field="stop")
        for stop in self.stop:
            encode_utf8(stop, field="stop", name="stop string")
        if self.tools is not None and not isinstance(self.tools, tuple):
            if not isinstance(self.tools, list):
                raise ConfigError(
                    f"tools must be a list of tool definitions, got {self.tools!r}.", field="tools"
                )
            object.__setattr__(self, "tools", tuple(self.tools))
        if self.prediction is not None:
            object.__setattr__(self, "prediction", prediction_text(self.prediction))
            encode_utf8(self.prediction, field="prediction")

    @property
    def is_chat(self) -> bool:
        """Whether the request carries chat messages."""
        return self.messages is not None

    @property
    def greedy(self) -> bool:
        """Whether decoding is greedy (temperature 0)."""
        return self.temperature == 0.0

    def replace(self, **changes: Any) -> GenerationRequest:
        """Return a copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_messages(
        cls, messages: Sequence[Message | Mapping[str, Any]], **options: Any
    ) -> GenerationRequest:
        """Build a chat request from ``Message`` objects or OpenAI-style dicts."""
        converted = tuple(
            m if isinstance(m, Message) else Message(role=m["role"], content=m.get("content") or "")
            for m in messages
        )
        return cls(messages=converted, **options)


@dataclass(frozen=True, slots=True)
class Token:
    """One generated token with its provenance.

    Args:
        text: Decoded text of the token (may be empty for partial UTF-8 sequences).
        provenance: ``draft``, ``target`` or ``unknown``.
        id: Vocabulary id, when the backend reports it.
    """

    text: str
    provenance: Provenance = "unknown"
    id: int | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts in OpenAI's terms."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        """prompt_tokens + completion_tokens."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class PromptProgress:
    """How far a backend has processed a long prompt, before its first token.

    The local engine processes a prompt in chunks and reports after each chunk but the
    last (whose pass gives the first token): a prompt of one chunk gets no report.

    Example:
        >>> progress = PromptProgress(done=1024, total=4349, elapsed_s=7.1)
        >>> round(progress.tokens_per_second), round(progress.remaining_s or 0)
        (144, 23)

    Args:
        done: Prompt tokens processed so far, those taken from the prompt cache included.
        total: Tokens in the prompt.
        elapsed_s: Seconds spent processing the prompt so far.
        cached: Leading prompt tokens the cache already held (no pass computed them).
    """

    done: int
    total: int
    elapsed_s: float
    cached: int = 0

    @property
    def tokens_per_second(self) -> float | None:
        """Prompt tokens computed per second so far (None: none computed yet)."""
        computed = self.done - self.cached
        if computed <= 0 or self.elapsed_s <= 0:
            return None
        return computed / self.elapsed_s

    @property
    def remaining_s(self) -> float | None:
        """Seconds left at the rate so far, an estimate (None: no rate yet)."""
        rate = self.tokens_per_second
        return None if rate is None else max(self.total - self.done, 0) / rate


@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of a stream.

    A chunk with ``prompt_progress`` is a progress report: it carries nothing else (no
    text, tokens, statistics or usage) and is never final. It comes before the first
    token, while a long prompt is processed; a consumer that wants only the answer skips
    it (its text is empty, so joining the texts needs no check).

    Args:
        text: New text in this chunk (a delta).
        tokens: The tokens behind ``text``, with provenance.
        stats: Live statistics so far (``final`` False) or the final record (last chunk).
        finish_reason: Set on the last chunk.
        tool_call_deltas: The pieces of tool calls this chunk brings. Every call of a
            stream arrives this way, as the backend learns it: in many pieces from a
            server that streams its calls, in one piece (``ToolCallDelta.whole``) on the
            last chunk from one that knows a call only once it is complete.
        tool_calls: The answer's complete tool calls, parsed (on the last chunk only,
            whether or not their pieces came earlier).
        usage: Token counts (on the last chunk).
        final: Whether this is the last chunk of the stream.
        prompt_progress: How far the prompt's processing is (progress reports only).
    """

    text: str = ""
    tokens: tuple[Token, ...] = ()
    stats: SpecStats | None = None
    finish_reason: FinishReason | None = None
    tool_call_deltas: tuple[ToolCallDelta, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage | None = None
    final: bool = False
    prompt_progress: PromptProgress | None = None

    @property
    def is_progress(self) -> bool:
        """Whether this chunk only reports the prompt's progress (see ``prompt_progress``)."""
        return self.prompt_progress is not None

    def with_whole_tool_call_deltas(self) -> Chunk:
        """This chunk with each of its ``tool_calls`` also as one whole ``ToolCallDelta``.

        For a last chunk whose calls no earlier chunk streamed: a consumer that reads the
        deltas (a framework's streamed tool-call chunks) then gets every call once.
        """
        deltas = tuple(
            ToolCallDelta.whole(index, call) for index, call in enumerate(self.tool_calls)
        )
        return dataclasses.replace(self, tool_call_deltas=deltas)


@dataclass(frozen=True, slots=True)
class Completion:
    """The result of a generation.

    Args:
        text: Generated text.
        stats: Statistics of the generation (always present; ``source`` says how exact).
        tokens: Generated tokens with provenance (empty when the backend gives none).
        finish_reason: Why generation ended.
        tool_calls: Tool calls requested by the model.
        usage: Token counts.
        model: Name of the model that answered.
        raw: The backend's raw response, when there is one.
    """

    text: str
    stats: SpecStats
    tokens: tuple[Token, ...] = ()
    finish_reason: FinishReason | None = "stop"
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    raw: dict[str, Any] | None = None

    @classmethod
    def from_chunks(
        cls, chunks: Iterable[Chunk], *, model: str = "", backend: str = "unknown"
    ) -> Completion:
        """Accumulate a stream into one completion (the last chunk's stats win)."""
        pieces: list[str] = []
        tokens: list[Token] = []
        stats: SpecStats | None = None
        finish_reason: FinishReason | None = None
        tool_calls: tuple[ToolCall, ...] = ()
        usage: Usage | None = None
        for chunk in chunks:
            pieces.append(chunk.text)
            tokens.extend(chunk.tokens)
            stats = chunk.stats or stats
            finish_reason = chunk.finish_reason or finish_reason
            tool_calls = chunk.tool_calls or tool_calls
            usage = chunk.usage or usage
        return cls(
            text="".join(pieces),
            stats=stats or SpecStats.unavailable(backend),
            tokens=tuple(tokens),
            finish_reason=finish_reason,
            tool_calls=tool_calls,
            usage=usage or Usage(completion_tokens=len(tokens)),
            model=model,
        )
