"""Record the model calls of a LangChain chain or agent to a JSONL trace, for the bench.

``TraceRecorderCallbackHandler`` writes one line per model call (``speculative_llm.traces``
describes the format): the messages (tool calls and tool results included), the tools,
the tool choice, the response format and the sampling parameters. ``speculative-llm
bench --prompts traces.jsonl`` then replays the calls, speculative against baseline.

Recording is opt-in: nothing is written unless the handler is passed to a run (or
``record_traces`` is entered). **The file holds your prompts**: every system prompt,
user message, retrieved document and tool result of the recorded calls. Pass
``redact=`` to change or drop records before they are written.

It works with any LangChain chat model (``ChatSpeculative``, ``ChatOpenAI``...): it reads
what LangChain hands every callback handler, ``on_chat_model_start``'s messages and
``invocation_params`` (and the ``ls_*`` tracing metadata where a model keeps a default
there), and ``on_llm_start``'s prompts for text-completion models.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_core.tracers.context import register_configure_hook
from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool

from langchain_speculative._convert import to_core_messages, to_core_tool_choice
from speculative_llm.errors import SpeculativeError
from speculative_llm.traces import Redactor, TraceWriter

__all__ = ["TraceRecorderCallbackHandler", "record_traces", "request_fields"]

logger = logging.getLogger(__name__)

FRAMEWORK = "langchain"
"""The ``framework`` of the records this module writes."""

# Where chat models keep their generation budget in invocation_params, by provider.
_MAX_TOKENS_KEYS = (
    "max_tokens",
    "max_completion_tokens",
    "max_new_tokens",
    "max_output_tokens",
    "num_predict",
)


def _first(params: Mapping[str, Any], *keys: str) -> Any:
    """The first of ``keys`` that ``params`` holds a value (not None) for."""
    return next((params[key] for key in keys if params.get(key) is not None), None)


def _openai_tool(tool: Any) -> dict[str, Any]:
    """A bound tool in OpenAI's form (providers that keep their own are converted)."""
    if isinstance(tool, Mapping) and tool.get("type") == "function" and "function" in tool:
        return dict(tool)
    return convert_to_openai_tool(tool)


def _response_format(value: Any) -> dict[str, Any] | None:
    """OpenAI ``response_format`` from a bound one: a dict, or a schema class to convert."""
    if value is None or isinstance(value, Mapping):
        return None if value is None else dict(value)
    schema = convert_to_json_schema(value)
    return {
        "type": "json_schema",
        "json_schema": {"name": schema.get("title", "response"), "schema": schema},
    }


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(item) for item in value]


def request_fields(
    invocation_params: Mapping[str, Any] | None, metadata: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The tools, tool choice, response format and sampling parameters of one model call.

    ``invocation_params`` are the model's parameters with the call's bound keyword
    arguments (``bind_tools``, ``with_structured_output``, ``bind``); LangChain's ``ls_*``
    metadata fills in the standard parameters a model keeps elsewhere (``ls_stop``: the
    model's own ``stop``). A named tool choice becomes that tool alone with
    ``"required"``, as ``ChatSpeculative`` sends it.

    Returns:
        ``TraceWriter.write``'s keyword arguments but the messages or prompt.
    """
    params = dict(invocation_params or {})
    tracing = dict(metadata or {})
    raw_tools = params.get("tools")
    tools = [_openai_tool(tool) for tool in raw_tools] if raw_tools else None
    tool_choice = params.get("tool_choice")
    if tools and tool_choice is not None:
        try:
            offered, tool_choice = to_core_tool_choice(tool_choice, tools)
            tools = list(offered)
        except SpeculativeError:
            pass  # a choice no tool answers to: keep it as the model got it
    max_tokens = _first(params, *_MAX_TOKENS_KEYS)
    if max_tokens is None:
        max_tokens = tracing.get("ls_max_tokens")
    temperature = params.get("temperature")
    if temperature is None:
        temperature = tracing.get("ls_temperature")
    stop = params.get("stop")
    if stop is None:
        stop = tracing.get("ls_stop")
    return {
        "model": _first(params, "model_name", "model") or tracing.get("ls_model_name"),
        "tools": tools,
        "tool_choice": tool_choice if tools else None,
        "response_format": _response_format(params.get("response_format")),
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": params.get("top_p"),
        "top_k": params.get("top_k"),
        "stop": _stop(stop),
        "seed": params.get("seed"),
    }


class TraceRecorderCallbackHandler(BaseCallbackHandler):
    """Writes the request of every model call it sees to a JSONL trace file.

    One line per call, in the order the calls start: messages, tools, tool choice,
    response format and sampling parameters (``speculative_llm.traces``). Replay
    the file with ``speculative-llm bench --prompts FILE``: each session is a row of
    its own, speculative against baseline.

    **The file holds prompts**: every message the recorded calls sent, tool results and
    retrieved text included. Use ``redact`` to change or drop a record before it is
    written. Nothing is recorded unless this handler is passed to a run (or
    ``record_traces`` is entered). A call whose messages hold no text form (images,
    audio) is not recorded: it is logged and counted in ``skipped``.

    Args:
        path: The JSONL file (appended to; created if missing).
        session: Name of the first session (default: ``langchain-`` and the time).
        redact: Called with each record (a dict) before it is written; returns it,
            changed or not, or None to drop it.

    Example:
        .. code-block:: python

            recorder = TraceRecorderCallbackHandler("traces.jsonl", session="support")
            agent.invoke({"messages": [...]}, config={"callbacks": [recorder]})
            recorder.start_session("support-2")  # the next calls, a session of their own
            # then: speculative-llm bench --prompts traces.jsonl
    """

    # Writing happens under a lock: run inline so async runs keep the calls' order.
    run_inline: bool = True

    def __init__(
        self,
        path: str | Path,
        *,
        session: str | None = None,
        redact: Redactor | None = None,
    ) -> None:
        """Prepare the writer; the file is opened for each record."""
        super().__init__()
        self._writer = TraceWriter(path, framework=FRAMEWORK, session=session, redact=redact)
        self._skipped = 0

    # ---- callbacks -----------------------------------------------------------------------

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Record one call per message list (a batch holds several)."""
        fields = request_fields(kwargs.get("invocation_params"), metadata)
        for conversation in messages:
            try:
                core = to_core_messages(conversation)
            except SpeculativeError as error:
                self._skip(error)
                continue
            self._writer.write(messages=core, **fields)

    def on_llm_start(
        self,
        serialized: dict[str, Any],
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Record one plain-text call per prompt (text-completion models)."""
        fields = request_fields(kwargs.get("invocation_params"), metadata)
        for prompt in prompts:
            self._writer.write(prompt=prompt, **fields)

    def _skip(self, error: Exception) -> None:
        self._skipped += 1
        logger.warning("A model call was not recorded: %s", error)

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
            The session's name (``name``, or ``langchain-`` and the time).
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


_trace_recorder_var: ContextVar[TraceRecorderCallbackHandler | None] = ContextVar(
    "speculative_llm_trace_recorder", default=None
)
# Registered once: every run configured while the variable is set gets the recorder.
register_configure_hook(_trace_recorder_var, inheritable=True)


@contextmanager
def record_traces(
    path: str | Path,
    *,
    session: str | None = None,
    redact: Redactor | None = None,
) -> Iterator[TraceRecorderCallbackHandler]:
    """Record every LangChain model call made inside the block (see the handler).

    Example:
        .. code-block:: python

            with record_traces("traces.jsonl", session="triage") as recorder:
                agent.invoke({"messages": [{"role": "user", "content": "..."}]})
            print(len(recorder.records), "calls recorded")

    Yields:
        The recording handler.
    """
    recorder = TraceRecorderCallbackHandler(path, session=session, redact=redact)
    token = _trace_recorder_var.set(recorder)
    try:
        yield recorder
    finally:
        _trace_recorder_var.reset(token)
