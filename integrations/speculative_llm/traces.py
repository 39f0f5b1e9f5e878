r"""Recorded model calls: the trace format, a writer with a redaction hook, and a reader.

The request recorders of the framework adapters (LangChain's
``TraceRecorderCallbackHandler``, LlamaIndex's ``TraceRecorderHandler``) write each model
call of a chain or agent as one JSON line; ``speculative-llm bench --prompts FILE``
replays the calls, speculative against baseline, one table row per session.

**A trace file holds prompts**: every system prompt, user message, retrieved document
and tool result the chain sent to its model. Keep it where you keep that data, and
give the recorder a ``redact`` callable to change or drop records before they are
written.

A record (format version 1) is one JSON object per line::

    {"schema": "speculative-llm-trace/1", "session": "support-agent", "call": 2,
     "framework": "langchain", "model": "smollm2-135m",
     "recorded_at": "2026-12-05T10:00:00+00:00",
     "messages": [{"role": "system", "content": "..."},
                  {"role": "user", "content": "What is 2 + 3?"},
                  {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1",
                   "type": "function", "function": {"name": "add",
                   "arguments": "{\"a\": 2, \"b\": 3}"}}]},
                  {"role": "tool", "content": "5", "tool_call_id": "call_1", "name": "add"}],
     "tools": [{"type": "function", "function": {"name": "add", ...}}],
     "tool_choice": "auto", "response_format": null,
     "max_tokens": 256, "temperature": 0.0, "top_p": null, "top_k": null,
     "stop": [], "seed": null}

* ``schema`` (required): ``speculative-llm-trace/<version>``; a reader refuses versions
  it does not know, naming the line.
* ``session`` (required): the name of the run the call belongs to; the bench reports
  each session as a category of its own.
* ``call`` (required): the call's number in its session, from 1; the bench replays a
  session's calls in file order and names each ``<session>#<call>``.
* ``messages`` (OpenAI chat messages: ``system``, ``user``, ``assistant`` with
  ``tool_calls``, ``tool`` with ``tool_call_id``) or ``prompt`` (plain text): exactly one.
* ``tools``, ``tool_choice``, ``response_format``: OpenAI's forms, or null.
* ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop``, ``seed``: the call's
  sampling parameters; null where the call set none (the backend's default applied).
* ``framework``, ``model``, ``recorded_at``: what recorded it, for the reader; the bench
  ignores them (it replays on the model it is given).
"""

from __future__ import annotations

import copy
import json
import re
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from speculative_llm.errors import ConfigError
from speculative_llm.types import GenerationRequest, Message, ToolCall

__all__ = [
    "TRACE_FORMAT",
    "TRACE_SCHEMA",
    "TRACE_VERSION",
    "Redactor",
    "TraceCall",
    "TraceWriter",
    "is_trace_record",
    "message_from_openai",
    "parse_trace_record",
    "trace_record",
]

TRACE_FORMAT = "speculative-llm-trace"
"""Name of the format, the part of ``schema`` before the version."""

TRACE_VERSION = 1
"""Version of the format this package writes and reads."""

TRACE_SCHEMA = f"{TRACE_FORMAT}/{TRACE_VERSION}"
"""The ``schema`` value of every record this package writes."""

Redactor = Callable[[dict[str, Any]], dict[str, Any] | None]
"""Gets each record (a copy, safe to change) before it is written; returns the record
to write, changed or not, or None to drop it."""

_SCHEMA_PATTERN = re.compile(rf"^{re.escape(TRACE_FORMAT)}/(\d+)$")
_ROLES = ("system", "user", "assistant", "tool")
_SAMPLING = ("max_tokens", "temperature", "top_p", "top_k", "stop", "seed")


# ---- writing --------------------------------------------------------------------------------


def trace_record(
    *,
    session: str,
    call: int,
    framework: str,
    messages: Sequence[Message] | None = None,
    prompt: str | None = None,
    model: str | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: str | Mapping[str, Any] | None = None,
    response_format: Mapping[str, Any] | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    stop: Sequence[str] = (),
    seed: int | None = None,
) -> dict[str, Any]:
    """One model call as a trace record (see the module docstring for the fields).

    Raises:
        ConfigError: Neither or both of ``messages`` and ``prompt``.
    """
    if (messages is None) == (prompt is None):
        raise ConfigError("A trace record holds either messages or a prompt.", field="messages")
    record: dict[str, Any] = {
        "schema": TRACE_SCHEMA,
        "session": session,
        "call": call,
        "framework": framework,
        "model": model,
        "recorded_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if messages is not None:
        record["messages"] = [message.to_openai() for message in messages]
    else:
        record["prompt"] = prompt
    record.update(
        {
            "tools": None if tools is None else [dict(tool) for tool in tools],
            "tool_choice": dict(tool_choice) if isinstance(tool_choice, Mapping) else tool_choice,
            "response_format": None if response_format is None else dict(response_format),
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "stop": [stop] if isinstance(stop, str) else list(stop),
            "seed": seed,
        }
    )
    return record


def _default_session(framework: str) -> str:
    """A session name that says what recorded it and when, unique enough to share a file."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{framework}-{stamp}-{uuid.uuid4().hex[:4]}"


class TraceWriter:
    """Appends trace records to a JSONL file, one line per model call; thread-safe.

    The framework recorders build on it; use it directly to record calls of your own
    code. **The file holds the prompts of every call** (see the module docstring).

    Args:
        path: The JSONL file; created if missing, appended to if it exists.
        framework: What records the calls (``langchain``, ``llama_index``...).
        session: Name of the first session (default: the framework and the time).
        redact: Gets each record before it is written and returns it, changed or not,
            or None to drop it (``Redactor``).

    Example:
        >>> import tempfile, pathlib
        >>> from speculative_llm.types import Message
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "traces.jsonl"
        >>> writer = TraceWriter(path, framework="mine", session="demo")
        >>> writer.write(messages=[Message("user", "hi")], max_tokens=16)["call"]
        1
    """

    def __init__(
        self,
        path: str | Path,
        *,
        framework: str,
        session: str | None = None,
        redact: Redactor | None = None,
    ) -> None:
        """Open nothing yet: each record is appended when it is written."""
        if redact is not None and not callable(redact):
            raise ConfigError(
                f"redact must be a callable that takes a record and returns it or None, got "
                f"{redact!r}.",
                field="redact",
            )
        self.path = Path(path)
        self.framework = framework
        self._redact = redact
        self._lock = threading.Lock()
        self._session = self._checked_session(session) or _default_session(framework)
        self._calls = 0
        self._records: list[dict[str, Any]] = []
        self._dropped = 0

    @staticmethod
    def _checked_session(name: str | None) -> str | None:
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ConfigError(
                f"A session name must be a non-empty string, got {name!r}.", field="session"
            )
        return None if name is None else name.strip()

    @property
    def session(self) -> str:
        """Name of the session the next call is recorded in."""
        with self._lock:
            return self._session

    def start_session(self, name: str | None = None) -> str:
        """Record the calls from now on in a new session (numbered from 1 again).

        Args:
            name: The session's name (default: the framework and the time).

        Returns:
            The session's name.
        """
        session = self._checked_session(name) or _default_session(self.framework)
        with self._lock:
            self._session, self._calls = session, 0
        return session

    def write(self, **fields: Any) -> dict[str, Any] | None:
        """Number one call in the current session, redact it and append it to the file.

        Args:
            **fields: ``trace_record``'s arguments but ``session``, ``call`` and
                ``framework``.

        Returns:
            The record as written, or None when ``redact`` dropped it.

        Raises:
            ConfigError: ``redact`` returned something other than a dict or None.
            TypeError: A value cannot be written as JSON.
        """
        with self._lock:
            self._calls += 1
            record = trace_record(
                session=self._session, call=self._calls, framework=self.framework, **fields
            )
            if self._redact is not None:
                redacted = self._redact(copy.deepcopy(record))
                if redacted is None:
                    self._dropped += 1
                    return None
                if not isinstance(redacted, dict):
                    raise ConfigError(
                        f"redact must return the record (a dict) or None, got "
                        f"{type(redacted).__name__}.",
                        field="redact",
                    )
                record = redacted
            line = json.dumps(record, ensure_ascii=False)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(line + "\n")
            self._records.append(record)
            return record

    @property
    def records(self) -> list[dict[str, Any]]:
        """The records written by this writer, in order (redacted ones as written)."""
        with self._lock:
            return list(self._records)

    @property
    def dropped(self) -> int:
        """How many records ``redact`` dropped."""
        with self._lock:
            return self._dropped


# ---- reading --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TraceCall:
    """One recorded model call, read back and checked.

    Attributes:
        session: The session it belongs to.
        call: Its number in the session.
        messages: Chat messages, or None for a plain prompt.
        prompt: The plain-text prompt, when ``messages`` is None.
        tools: Tools offered (OpenAI form), or None.
        tool_choice: The tool choice, or None.
        response_format: OpenAI ``response_format``, or None.
        max_tokens: The call's generation budget (None: it set none).
        temperature: Sampling temperature (None: the default, greedy).
        top_p: Nucleus mass (None: the default).
        top_k: Top-k (None: the default).
        stop: Stop strings.
        seed: Sampling seed, or None.
        framework: What recorded it.
        model: The model it was sent to, as the framework named it.
    """

    session: str
    call: int
    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    framework: str | None = None
    model: str | None = None


def is_trace_record(record: object) -> bool:
    """Whether a decoded JSONL object claims to be a trace record (it has ``schema``)."""
    return isinstance(record, Mapping) and "schema" in record


def _tool_call_from_openai(raw: object, where: str) -> ToolCall:
    function = raw.get("function") if isinstance(raw, Mapping) else None
    if not isinstance(raw, Mapping) or not isinstance(function, Mapping):
        raise ConfigError(
            f"{where}: a tool call must be {{'id', 'type': 'function', 'function': "
            f"{{'name', 'arguments'}}}}, got {raw!r}.",
            field="messages",
        )
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: a tool call has no function name.", field="messages")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"{where}: the arguments of tool call {name!r} are not valid JSON ({error.msg}).",
                field="messages",
            ) from error
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise ConfigError(
            f"{where}: the arguments of tool call {name!r} must be a JSON object.",
            field="messages",
        )
    call_id = raw.get("id")
    return ToolCall(name=name, arguments=dict(arguments), id=str(call_id or ""))


def message_from_openai(raw: object, where: str) -> Message:
    """A core ``Message`` from one OpenAI chat message (the form ``Message.to_openai`` writes).

    Args:
        raw: The decoded message.
        where: Location for error messages (``file.jsonl:3: messages[2]``).

    Raises:
        ConfigError: Not a message, an unknown role, or content that is not text.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a message object, got {raw!r}.", field="messages")
    role = raw.get("role")
    if role not in _ROLES:
        raise ConfigError(
            f"{where}: role {role!r}; a recorded message is system, user, assistant or tool.",
            field="messages",
        )
    content = raw.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise ConfigError(
            f"{where}: content must be a string (text only), got {type(content).__name__}.",
            field="messages",
        )
    calls = raw.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ConfigError(f"{where}: tool_calls must be a list.", field="messages")
    tool_call_id = raw.get("tool_call_id")
    name = raw.get("name")
    return Message(
        role=role,
        content=content,
        tool_calls=tuple(_tool_call_from_openai(call, where) for call in calls),
        tool_call_id=None if tool_call_id is None else str(tool_call_id),
        name=None if name is None else str(name),
    )


def _version(record: Mapping[str, Any], where: str) -> int:
    schema = record.get("schema")
    match = _SCHEMA_PATTERN.match(schema) if isinstance(schema, str) else None
    if match is None:
        raise ConfigError(
            f"{where}: 'schema' is {schema!r}, not a trace record ({TRACE_SCHEMA!r}). A prompt "
            "line has no 'schema' key; a recorded call has this package's trace schema.",
            field="prompts",
        )
    version = int(match.group(1))
    if version != TRACE_VERSION:
        raise ConfigError(
            f"{where}: trace format version {version} is unknown to this speculative-llm, "
            f"which reads version {TRACE_VERSION}. "
            + (
                "Upgrade speculative-llm to replay it, or record the calls again with this one."
                if version > TRACE_VERSION
                else "Record the calls again with this version of speculative-llm."
            ),
            field="prompts",
        )
    return version


_WRONG = object()
"""What ``_optional`` returns for a value of the wrong type."""


def _optional(record: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = record.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
        return _WRONG
    return value


def parse_trace_record(record: Mapping[str, Any], *, where: str) -> TraceCall:
    """Check one decoded trace record and read it (see the module docstring for the format).

    Args:
        record: The decoded JSON object.
        where: Location for error messages (``file.jsonl:12``).

    Raises:
        ConfigError: An unknown schema or version, a missing ``session`` or ``call``,
            neither or both of ``messages`` and ``prompt``, or a malformed value; the
            message names the line and the field.
    """
    _version(record, where)
    session = record.get("session")
    if not isinstance(session, str) or not session.strip():
        raise ConfigError(f"{where}: 'session' must be a non-empty string.", field="session")
    call = record.get("call")
    if isinstance(call, bool) or not isinstance(call, int) or call < 1:
        raise ConfigError(f"{where}: 'call' must be an integer >= 1, got {call!r}.", field="call")
    given = [key for key in ("messages", "prompt") if record.get(key) is not None]
    if len(given) != 1:
        raise ConfigError(
            f"{where}: a recorded call has exactly one of 'messages' or 'prompt', found "
            f"{given or 'none'}.",
            field="messages",
        )
    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    if "messages" in given:
        raw_messages = record["messages"]
        if not isinstance(raw_messages, list) or not raw_messages:
            raise ConfigError(f"{where}: 'messages' must be a non-empty list.", field="messages")
        messages = tuple(
            message_from_openai(item, f"{where}: messages[{index}]")
            for index, item in enumerate(raw_messages)
        )
    else:
        prompt = record["prompt"]
        if not isinstance(prompt, str):
            raise ConfigError(f"{where}: 'prompt' must be a string.", field="prompt")
    tools = record.get("tools")
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools)
    ):
        raise ConfigError(f"{where}: 'tools' must be a list of OpenAI tool objects.", field="tools")
    tool_choice = record.get("tool_choice")
    if tool_choice is not None and not isinstance(tool_choice, str | Mapping):
        raise ConfigError(
            f"{where}: 'tool_choice' must be a string or an object, got {tool_choice!r}.",
            field="tool_choice",
        )
    response_format = record.get("response_format")
    if response_format is not None and not isinstance(response_format, Mapping):
        raise ConfigError(f"{where}: 'response_format' must be an object.", field="response_format")
    stop = record.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ConfigError(f"{where}: 'stop' must be a list of strings.", field="stop")
    kinds: dict[str, type | tuple[type, ...]] = {
        "max_tokens": int,
        "temperature": (int, float),
        "top_p": (int, float),
        "top_k": int,
        "seed": int,
    }
    numbers = {key: _optional(record, key, kind) for key, kind in kinds.items()}
    for key, value in numbers.items():
        if value is _WRONG:
            raise ConfigError(
                f"{where}: '{key}' must be a number or null, got {record.get(key)!r}.", field=key
            )
    traced = TraceCall(
        session=session.strip(),
        call=call,
        messages=messages,
        prompt=prompt,
        tools=None if tools is None else tuple(dict(t) for t in tools),
        tool_choice=dict(tool_choice) if isinstance(tool_choice, Mapping) else tool_choice,
        response_format=None if response_format is None else dict(response_format),
        stop=tuple(stop),
        framework=record.get("framework") if isinstance(record.get("framework"), str) else None,
        model=record.get("model") if isinstance(record.get("model"), str) else None,
        **numbers,
    )
    _check_as_request(traced, where)
    return traced


def _check_as_request(traced: TraceCall, where: str) -> None:
    """The checks every request gets (ranges, empty text), with the line in the message."""
    options = {key: getattr(traced, key) for key in _SAMPLING if getattr(traced, key) is not None}
    try:
        GenerationRequest(
            messages=traced.messages,
            prompt=traced.prompt,
            tools=traced.tools,
            tool_choice=traced.tool_choice,
            response_format=traced.response_format,
            **options,
        )
    except ConfigError as error:
        raise ConfigError(f"{where}: {error}", field=error.field) from error
