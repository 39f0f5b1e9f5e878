"""Real agents as bench contenders: LangChain's ``create_agent``, LlamaIndex's ``FunctionAgent``.

``AgentContender`` wraps a ``BackendContender`` (one variant: a backend and the request's
``SpecConfig``). It runs a single-generation prompt as the contender does, and an agent
session (a ``BenchPrompt`` with ``agent`` set, see ``bench.agent_tasks``) through the
framework's agent over our wrapper of that backend: ``ChatSpeculative`` or
``Speculative``, the same objects a user builds. The runner times the call end to end
(framework included); a ``RecordingBackend`` between the wrapper and the backend keeps
every request's statistics, which add up to the session's tokens and ``SpecStats``.

Every call uses the prompt cache, on every contender that has one, as a user's agent
does: llama-server's ``cache_prompt`` and the local engine's ``prompt_cache`` keep the
prefix a call shares with the one before (within a session its whole last prompt; at a
session's start the system message and tools, the same for every session and every
contender, so our variants sharing one engine start from the same prefix either way).

Tools reach the model as the backend does it best: the in-process engine's own tool
calling (a grammar over its tool-call JSON), and ``tool_calling="json_schema"`` on
servers (the same tool descriptions, the answer constrained by ``response_format``), so
every contender sees the same prompt and the same JSON format; llama-server also gets
the local engine's JSON grammar (``bench.same_work``).

A session never crashes the run: a step cap, a call cut at ``max_tokens`` or any error
inside the framework ends it, and its tally says why (``AgentTally.error``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from speculative_llm.backends.base import Backend, Capabilities, ModelInfo
from speculative_llm.backends.registry import IN_PROCESS_BACKENDS, resolve_backend_name
from speculative_llm.bench.agent_tasks import AGENT_MAX_STEPS, AGENT_SYSTEM_PROMPT, AGENT_TOOLS
from speculative_llm.bench.contenders import BackendContender
from speculative_llm.bench.outcomes import Contender, Outcome, outcome_of
from speculative_llm.bench.prompts import BenchPrompt
from speculative_llm.bench.records import AgentTally
from speculative_llm.bench.same_work import as_the_local_engine_asks
from speculative_llm.config import SpecConfig
from speculative_llm.json_tools import TOOL_KEY
from speculative_llm.stats import SpecStats
from speculative_llm.types import Chunk, Completion, GenerationRequest

__all__ = [
    "AgentContender",
    "AgentSession",
    "RecordingBackend",
    "SessionResult",
    "agent_call_preparer",
    "framework_missing",
    "open_agent_session",
    "session_outcome",
]

_EXTRAS = {"langchain": "langchain", "llama_index": "llama-index"}
_MODULES = {
    "langchain": ("langchain.agents", "langchain_core", "langchain_speculative"),
    "llama_index": (
        "llama_index.core.agent.workflow",
        "llama_index.llms.speculative",
    ),
}
_ADAPTER_DISTRIBUTIONS = {
    "langchain_speculative": "langchain-speculative",
    "llama_index.llms.speculative": "llama-index-llms-speculative",
}
"""The distribution that brings each adapter module."""
_AGENT_NAMES = {
    "langchain": "LangChain's create_agent",
    "llama_index": "LlamaIndex's FunctionAgent",
}


def framework_missing(framework: str) -> str | None:
    """Why ``framework``'s agent cannot run here (a missing package), or None when it can."""
    import importlib

    for module in _MODULES[framework]:
        try:
            importlib.import_module(module)
        except ImportError as error:
            missing = error.name or module
            # The adapters are distributions of their own; the frameworks come with extras.
            adapter = _ADAPTER_DISTRIBUTIONS.get(missing)
            install = adapter or f'"speculative-llm[{_EXTRAS[framework]}]"'
            return (
                f"{_AGENT_NAMES[framework]} not run: {missing} is not installed "
                f"(pip install {install}; docs/installation.md)."
            )
    return None


class RecordingBackend(Backend):
    """Passes every request to another backend and keeps what each one produced.

    The wrappers see the inner backend's name, capabilities and model; ``take`` hands
    over the outcomes of the requests since the last ``take``.

    Args:
        inner: The backend that generates (not closed by this one).
        prepare: What the inner backend gets for each request (see
            ``agent_call_preparer``); None passes requests as they are.
    """

    def __init__(
        self,
        inner: Backend,
        *,
        prepare: Callable[[GenerationRequest], GenerationRequest] | None = None,
    ) -> None:
        self.inner = inner
        self._prepare = prepare or (lambda request: request)
        # The wrappers decide by the backend's name (in-process or server): keep the inner's.
        self.name = inner.name  # type: ignore[misc]
        self._lock = threading.Lock()
        self._outcomes: list[Outcome] = []

    @property
    def capabilities(self) -> Capabilities:
        """The inner backend's capabilities."""
        return self.inner.capabilities

    @property
    def model_name(self) -> str:
        """The inner backend's model."""
        return self.inner.model_name

    def model_info(self) -> ModelInfo:
        """The inner backend's model facts."""
        return self.inner.model_info()

    def check_request(self, request: GenerationRequest) -> None:
        """The inner backend's checks."""
        self.inner.check_request(request)

    def _record(self, completion: Completion) -> None:
        with self._lock:
            self._outcomes.append(outcome_of(completion))

    def take(self) -> list[Outcome]:
        """The outcomes recorded since the last call, in completion order."""
        with self._lock:
            taken, self._outcomes = self._outcomes, []
        return taken

    def generate(self, request: GenerationRequest) -> Completion:
        """Generate through the inner backend and record the completion."""
        completion = self.inner.generate(self._prepare(request))
        self._record(completion)
        return completion

    async def agenerate(self, request: GenerationRequest) -> Completion:
        """Async twin of ``generate``."""
        completion = await self.inner.agenerate(self._prepare(request))
        self._record(completion)
        return completion

    def _record_chunks(self, chunks: Sequence[Chunk]) -> None:
        if chunks and chunks[-1].final:
            self._record(Completion.from_chunks(chunks, model=self.model_name, backend=self.name))

    def stream(self, request: GenerationRequest) -> Iterator[Chunk]:
        """Stream from the inner backend; the finished stream is recorded."""
        seen: list[Chunk] = []
        try:
            for chunk in self.inner.stream(self._prepare(request)):
                seen.append(chunk)
                yield chunk
        finally:
            self._record_chunks(seen)

    async def astream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """Async twin of ``stream``."""
        seen: list[Chunk] = []
        try:
            async for chunk in self.inner.astream(self._prepare(request)):
                seen.append(chunk)
                yield chunk
        finally:
            self._record_chunks(seen)


def _with_extra(request: GenerationRequest, **fields: Any) -> GenerationRequest:
    return request.replace(extra={**request.extra, **fields})


def agent_call_preparer(
    backend: Backend,
) -> Callable[[GenerationRequest], GenerationRequest] | None:
    """How the bench sends an agent's calls to ``backend`` (None: as they are).

    With the prompt cache where the backend has one: the local engine's (off under
    ``exact="bitwise"``, where asking for it is an error) and llama-server's
    ``cache_prompt`` (the bench's managed servers are started with it off). llama-server
    also gets the local engine's JSON grammar (``same_work.as_the_local_engine_asks``).
    Other servers keep their own prefix caches.
    """
    name = resolve_backend_name(backend.name)
    if name in IN_PROCESS_BACKENDS:
        cached = getattr(backend, "exact", None) != "bitwise"
        return lambda request: _with_extra(request, cache_prompt=cached)
    if name == "llamacpp":
        return lambda request: as_the_local_engine_asks(_with_extra(request, cache_prompt=True))
    return None


class SessionResult:
    """What an agent said and did in one session.

    Args:
        answer: The final answer's text ("" when there was none).
        tool_calls: Tool calls made.
        answered: Whether the session ended with an answer.
        error: Why it ended without one, when it did.
    """

    __slots__ = ("answer", "answered", "error", "tool_calls")

    def __init__(
        self, answer: str, tool_calls: int, answered: bool, error: str | None = None
    ) -> None:
        self.answer = answer
        self.tool_calls = tool_calls
        self.answered = answered
        self.error = error


def _error_text(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 300 else text[:297] + "..."


def _cut_call(answer: str, max_tokens: int) -> str | None:
    """Why a final "answer" is a tool call cut short, or None when it is a real answer.

    A complete call becomes a tool call; one cut at ``max_tokens`` (or left unparseable)
    reaches the agent as its JSON text, which the agent takes for the final answer.
    """
    if answer.lstrip().startswith(f'{{"{TOOL_KEY}"'):
        return f"a tool call was cut at max_tokens ({max_tokens}): {answer[:80]}"
    return None


AgentSession = Callable[[str], SessionResult]
"""Answers one question with an agent built once (``open_agent_session``)."""


def _langchain_session(
    backend: Backend, spec: SpecConfig | None, tool_calling: str, max_tokens: int, max_steps: int
) -> AgentSession:
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import StructuredTool

    from langchain_speculative import ChatSpeculative

    chat = ChatSpeculative(
        backend=backend,
        speculative=spec,
        temperature=0,
        max_tokens=max_tokens,
        tool_calling=tool_calling,
    )
    tools = [
        StructuredTool.from_function(fn, handle_tool_error=True, handle_validation_error=True)
        for fn in AGENT_TOOLS
    ]
    agent = create_agent(chat, tools=tools, system_prompt=AGENT_SYSTEM_PROMPT)
    # A model call and the tools it asked for are two graph steps.
    config: Any = {"recursion_limit": 2 * max_steps}

    def run(question: str) -> SessionResult:
        messages: list[Any] = []
        error: str | None = None
        try:
            for state in agent.stream(
                {"messages": [{"role": "user", "content": question}]},
                config,
                stream_mode="values",
            ):
                messages = list(state["messages"])
        except Exception as failure:  # a step cap or a bad call ends the session, not the run
            error = _error_text(failure)
        tool_calls = sum(isinstance(m, ToolMessage) for m in messages)
        last = messages[-1] if messages else None
        final = isinstance(last, AIMessage) and not last.tool_calls
        answer = str(last.content) if final and last is not None else ""
        error = error or _cut_call(answer, max_tokens)
        answered = error is None and final and bool(answer.strip())
        return SessionResult(answer, tool_calls, answered, error)

    return run


def _llama_index_session(
    backend: Backend,
    spec: SpecConfig | None,
    tool_calling: str,
    max_tokens: int,
    max_steps: int,
    loop: asyncio.AbstractEventLoop,
) -> AgentSession:
    from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
    from llama_index.core.tools import FunctionTool

    from llama_index.llms.speculative import Speculative

    llm = Speculative(
        backend,
        speculative=spec,
        temperature=0.0,
        max_tokens=max_tokens,
        tool_calling=tool_calling,  # type: ignore[arg-type]
    )
    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(fn=fn) for fn in AGENT_TOOLS],
        llm=llm,
        system_prompt=AGENT_SYSTEM_PROMPT,
    )

    async def session(question: str) -> SessionResult:
        tool_calls = 0
        try:
            # FunctionAgent refuses the max_iterations-th call's output, answer or not: one
            # more lets max_steps calls count, as create_agent's recursion limit does.
            handler = agent.run(user_msg=question, max_iterations=max_steps + 1)
            async for event in handler.stream_events():
                if isinstance(event, ToolCallResult):
                    tool_calls += 1
            output: Any = await handler  # an AgentOutput
        except Exception as failure:  # a step cap or a bad call ends the session, not the run
            return SessionResult("", tool_calls, False, _error_text(failure))
        answer = str(output.response.content or "")
        error = _cut_call(answer, max_tokens)
        return SessionResult(answer, tool_calls, error is None and bool(answer.strip()), error)

    def run(question: str) -> SessionResult:
        # One loop for every session: the HTTP backends' async clients stay open on it.
        return loop.run_until_complete(session(question))

    return run


def open_agent_session(
    framework: str,
    backend: Backend,
    spec: SpecConfig | None,
    *,
    loop: asyncio.AbstractEventLoop,
    max_tokens: int,
    max_steps: int = AGENT_MAX_STEPS,
) -> AgentSession:
    """Build ``framework``'s agent over our wrapper of ``backend`` (imports included).

    Args:
        framework: ``langchain`` or ``llama_index``.
        backend: What the wrapper sends its requests to (a ``RecordingBackend``).
        spec: The requests' ``SpecConfig`` (None: the backend's own).
        loop: The event loop LlamaIndex's sessions run on.
        max_tokens: Generation budget of each model call.
        max_steps: Most model calls of a session.

    Raises:
        ValueError: An unknown framework.
        ImportError: The framework is not installed (see ``framework_missing``).
    """
    tool_calling = "native" if backend.name in IN_PROCESS_BACKENDS else "json_schema"
    if framework == "langchain":
        return _langchain_session(backend, spec, tool_calling, max_tokens, max_steps)
    if framework == "llama_index":
        return _llama_index_session(backend, spec, tool_calling, max_tokens, max_steps, loop)
    raise ValueError(f"unknown agent framework {framework!r}")


def session_outcome(framework: str, result: SessionResult, calls: Sequence[Outcome]) -> Outcome:
    """One ``Outcome`` for a whole session: its calls' tokens and statistics summed."""
    records = [call.stats for call in calls if call.stats is not None]
    stats = SpecStats.aggregate(records) if len(records) == len(calls) else None
    decode_times = [call.decode_s for call in calls]
    decode_s = (
        None
        if not calls or any(t is None for t in decode_times)
        else sum(t for t in decode_times if t is not None)
    )
    return Outcome(
        text=result.answer,
        token_ids=None,
        generated_tokens=sum(call.generated_tokens for call in calls),
        decode_s=decode_s,
        stats=stats,
        kernel_s=None if stats is None else stats.kernel_s,
        grammar_s=None if stats is None else stats.grammar_s,
        agent=AgentTally(
            framework=framework,
            model_calls=len(calls),
            tool_calls=result.tool_calls,
            answered=result.answered,
            error=result.error,
        ),
    )


class AgentContender:
    """A ``BackendContender`` that also answers agent sessions, through real agents.

    Args:
        inner: The contender (its variant, backend and ``SpecConfig``).
        frameworks: Frameworks to build agents for, now (outside any timing).
        loop: The event loop LlamaIndex's sessions run on.
        max_tokens: Generation budget of each model call of a session.
        opener: Builds a session (``open_agent_session``; tests pass a fake).
    """

    runs_agents = True
    """The runner gives agent sessions only to contenders that say so."""

    def __init__(
        self,
        inner: BackendContender,
        frameworks: Sequence[str],
        *,
        loop: asyncio.AbstractEventLoop,
        max_tokens: int,
        opener: Callable[..., AgentSession] = open_agent_session,
    ) -> None:
        self.inner = inner
        self.variant = inner.variant
        self.recorder = RecordingBackend(inner.backend, prepare=agent_call_preparer(inner.backend))
        self._sessions = {
            framework: opener(
                framework, self.recorder, inner.spec, loop=loop, max_tokens=max_tokens
            )
            for framework in frameworks
        }

    def run(self, prompt: BenchPrompt, max_tokens: int) -> Outcome:
        """A session through its framework's agent, or a single generation."""
        if prompt.agent is None:
            return self.inner.run(prompt, max_tokens)
        session = self._sessions[prompt.agent]
        question = prompt.messages[-1].content if prompt.messages else prompt.prompt or ""
        self.recorder.take()  # nothing from before this session counts
        result = session(question)
        return session_outcome(prompt.agent, result, self.recorder.take())

    def forget_outputs(self) -> None:
        """Empty the backend's memory of earlier outputs (suffix decoding's global trie)."""
        self.inner.forget_outputs()

    def close(self) -> None:
        """Close the inner contender."""
        self.inner.close()


def with_agents(
    contenders: Sequence[Contender],
    frameworks: Sequence[str],
    *,
    loop: asyncio.AbstractEventLoop,
    max_tokens: int,
) -> list[Contender]:
    """Every ``BackendContender`` made able to run agent sessions; other contenders as they are."""
    return [
        AgentContender(c, frameworks, loop=loop, max_tokens=max_tokens)
        if isinstance(c, BackendContender)
        else c
        for c in contenders
    ]
