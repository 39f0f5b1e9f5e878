"""Record the LLM calls of a LlamaIndex query engine or agent to a JSONL trace, for the bench.

``TraceRecorderHandler`` is an instrumentation event handler: LlamaIndex dispatches an
``LLMChatStartEvent`` (messages, the call's keyword arguments such as ``tools`` and
``tool_choice``, and the LLM's ``to_payload()``) or an ``LLMCompletionStartEvent``
(the prompt) before every LLM call, from any LLM class. The handler writes one line per
call (``speculative_llm.traces`` describes the format); ``speculative-llm bench
--prompts traces.jsonl`` then replays the calls, speculative against baseline.

Recording is opt-in: nothing is written unless the handler is added to a dispatcher
(or ``record_traces`` is entered). **The file holds your prompts**: every system prompt,
user message, retrieved document and tool result of the recorded calls. Pass
``redact=`` to change or drop records before they are written.

The sampling parameters come from the call's keyword arguments, else from the LLM's
payload: ``Speculative`` puts its defaults there; for other LLM classes the payload has
only ``num_output`` (written as ``max_tokens``), and the others are written as null
(the replay's defaults: greedy).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from llama_index.core.bridge.pydantic import PrivateAttr
from llama_index.core.instrumentation import (  # type: ignore[attr-defined]
    Dispatcher,
    get_dispatcher,
)
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.exception import ExceptionEvent
from llama_index.core.instrumentation.events.llm import (
    LLMChatEndEvent,
    LLMChatStartEvent,
    LLMCompletionStartEvent,
)
from llama_index_instrumentation.events.span import SpanDropEvent

from llama_index.llms.speculative.arguments import TOOL_CHOICES
from llama_index.llms.speculative.convert import to_core_messages
from llama_index.llms.speculative.tools import force_tool
from speculative_llm.errors import SpeculativeError
from speculative_llm.traces import Redactor, TraceWriter
from speculative_llm.types import Message

__all__ = ["TraceRecorderHandler", "record_traces", "request_fields"]

logger = logging.getLogger(__name__)

FRAMEWORK = "llama_index"
"""The ``framework`` of the records this module writes."""

_SAMPLING = ("temperature", "top_p", "top_k", "seed")


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(item) for item in value]


def _tool_dict(tool: Any) -> dict[str, Any]:
    """A tool in OpenAI's form: a dict as given, a LlamaIndex tool through its metadata."""
    if isinstance(tool, Mapping):
        return dict(tool)
    metadata = getattr(tool, "metadata", None)
    if metadata is not None and hasattr(metadata, "to_openai_tool"):
        return dict(metadata.to_openai_tool(skip_length_check=True))
    raise TypeError(f"cannot write tool {tool!r} in OpenAI form")


def request_fields(
    call_kwargs: Mapping[str, Any], payload: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The tools, tool choice, response format and sampling parameters of one LLM call.

    Args:
        call_kwargs: The call's keyword arguments (an event's ``additional_kwargs``).
        payload: The LLM's ``to_payload()`` (an event's ``model_dict``).

    A tool named as the choice becomes that tool alone with ``"required"``, as
    ``Speculative`` sends it.

    Returns:
        ``TraceWriter.write``'s keyword arguments but the messages or prompt.
    """
    defaults = dict(payload or {})
    raw_tools = call_kwargs.get("tools")
    tools = [_tool_dict(tool) for tool in raw_tools] if raw_tools else None
    tool_choice = call_kwargs.get("tool_choice") if tools else None
    if tools and isinstance(tool_choice, str) and tool_choice not in TOOL_CHOICES:
        try:
            offered, tool_choice = force_tool(tuple(tools), tool_choice)
            tools = list(offered)
        except SpeculativeError:
            pass  # a choice no tool answers to: keep it as the LLM got it
    max_tokens = call_kwargs.get("max_tokens", defaults.get("max_tokens"))
    if max_tokens is None and isinstance(defaults.get("num_output"), int):
        max_tokens = defaults["num_output"] if defaults["num_output"] > 0 else None
    fields: dict[str, Any] = {name: call_kwargs.get(name, defaults.get(name)) for name in _SAMPLING}
    response_format = call_kwargs.get("response_format")
    return {
        "model": defaults.get("model_name"),
        "tools": tools,
        "tool_choice": tool_choice,
        "response_format": dict(response_format) if isinstance(response_format, Mapping) else None,
        "max_tokens": max_tokens,
        "stop": _stop(call_kwargs.get("stop", defaults.get("stop"))),
        **fields,
    }


class TraceRecorderHandler(BaseEventHandler):
    """An instrumentation event handler that writes every LLM call's request to a JSONL trace.

    One line per call, in the order the calls start: messages (tool calls and results
    included), tools, tool choice, response format and sampling parameters
    (``speculative_llm.traces``). Replay the file with ``speculative-llm bench
    --prompts FILE``: each session is a row of its own, speculative against baseline.

    **The file holds prompts**: every message the recorded calls sent, retrieved text
    and tool results included. Use ``redact`` to change or drop a record before it is
    written. Nothing is recorded unless the handler is added to a dispatcher (or
    ``record_traces`` is entered). A handler on the root dispatcher sees the LLM calls of
    every thread of the process. A call whose messages hold no text form (images) is not
    recorded: it is logged and counted in ``skipped``.

    Args:
        path: The JSONL file (appended to; created if missing).
        session: Name of the first session (default: ``llama_index-`` and the time).
        redact: Called with each record (a dict) before it is written; returns it,
            changed or not, or None to drop it.

    Example:
        .. code-block:: python

            from llama_index.core.instrumentation import get_dispatcher

            recorder = TraceRecorderHandler("traces.jsonl", session="rag")
            get_dispatcher().add_event_handler(recorder)
            query_engine.query("What does the drafter do?")
            # then: speculative-llm bench --prompts traces.jsonl
    """

    _writer: TraceWriter = PrivateAttr()
    _skipped: int = PrivateAttr(default=0)
    # The span of the chat call under way in this context: LLMs built on CustomLLM answer
    # a chat through their own complete(), whose event is the same call again.
    _open_chat: ContextVar[str | None] = PrivateAttr()

    def __init__(
        self,
        path: str | Path,
        *,
        session: str | None = None,
        redact: Redactor | None = None,
        **data: Any,
    ) -> None:
        """Prepare the writer; the file is opened for each record."""
        super().__init__(**data)
        self._writer = TraceWriter(path, framework=FRAMEWORK, session=session, redact=redact)
        self._open_chat = ContextVar(f"trace_recorder_open_chat_{id(self)}", default=None)

    @classmethod
    def class_name(cls) -> str:
        """Name of this handler in LlamaIndex's instrumentation."""
        return "TraceRecorderHandler"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        """Record an LLM call as it starts; ignore other events."""
        if isinstance(event, LLMChatStartEvent):
            self._open_chat.set(event.span_id or "chat")
            fields = request_fields(event.additional_kwargs, event.model_dict)
            try:
                messages = to_core_messages(event.messages)
            except SpeculativeError as error:
                self._skipped += 1
                logger.warning("An LLM call was not recorded: %s", error)
                return
            self._writer.write(messages=messages, **fields)
        elif isinstance(event, LLMChatEndEvent | SpanDropEvent | ExceptionEvent):
            if self._open_chat.get() in (event.span_id, "chat"):
                self._open_chat.set(None)
        elif isinstance(event, LLMCompletionStartEvent):
            if self._open_chat.get() is not None:
                return  # the open chat's own completion: recorded as the chat
            fields = request_fields(event.additional_kwargs, event.model_dict)
            if event.model_dict.get("is_chat_model"):
                # A chat model answers a bare prompt as one user message (Speculative too).
                self._writer.write(messages=[Message("user", event.prompt)], **fields)
            else:
                self._writer.write(prompt=event.prompt, **fields)

    # ---- sessions and results ------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The trace file."""
        return self._writer.path

    @property
    def session(self) -> str:
        """The session the next call is recorded in."""
        return self._writer.session

    def start_session(self, name: str | None = None) -> str:
        """Record the calls from now on as a new session (its own row in the bench).

        Returns:
            The session's name (``name``, or ``llama_index-`` and the time).
        """
        return self._writer.start_session(name)

    @property
    def records(self) -> list[dict[str, Any]]:
        """The records written so far, as written (after ``redact``)."""
        return self._writer.records

    @property
    def dropped(self) -> int:
        """How many records ``redact`` dropped."""
        return self._writer.dropped

    @property
    def skipped(self) -> int:
        """How many calls could not be recorded (messages with no text form)."""
        return self._skipped


def _detach(dispatcher: Dispatcher, handler: TraceRecorderHandler) -> None:
    # Rebind rather than mutate in place: another thread may be iterating the old list.
    dispatcher.event_handlers = [h for h in dispatcher.event_handlers if h is not handler]


@contextmanager
def record_traces(
    path: str | Path,
    *,
    session: str | None = None,
    redact: Redactor | None = None,
    dispatcher: Dispatcher | None = None,
) -> Iterator[TraceRecorderHandler]:
    """Record the LLM calls made inside the ``with`` block (see ``TraceRecorderHandler``).

    Args:
        path: The JSONL file (appended to; created if missing).
        session: Name of the first session.
        redact: Changes or drops each record before it is written.
        dispatcher: Dispatcher to attach to; the root dispatcher (every call) by default.

    Example:
        .. code-block:: python

            with record_traces("traces.jsonl", session="rag") as recorder:
                query_engine.query("What does the drafter do?")
            print(len(recorder.records), "calls recorded")

    Yields:
        The attached handler.
    """
    target = dispatcher if dispatcher is not None else get_dispatcher()
    recorder = TraceRecorderHandler(path, session=session, redact=redact)
    target.add_event_handler(recorder)
    try:
        yield recorder
    finally:
        _detach(target, recorder)
