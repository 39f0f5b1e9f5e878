"""Benchmark prompts: the built-in Spec-Bench-style set and users' JSONL files.

The built-in set (``bench/prompts/<category>.jsonl``, written for this project) covers
Spec-Bench's categories plus code editing, 10 or more prompts each:

* ``multi_turn``: a conversation whose last user turn follows up on an earlier answer;
* ``translation``: short texts between European languages;
* ``summarization``: news-style articles to summarise in three sentences;
* ``qa``: open-domain questions;
* ``math_reasoning``: word problems solved step by step;
* ``rag``: a retrieved document and a question answered by quoting it (extraction);
* ``code_edit``: a source file and an edit request, answered with the whole file;
* ``structured``: fields extracted from a text into a JSON schema, and tool calls
  (``response_format`` or ``tools``), answered under a grammar on the local engine;
* ``structured_free``: the same prompts without their schema or tools, so the cost of
  the grammar shows next to the free runs;
* ``agent_loop``: four tool-calling sessions of a travel agent, step by step in order
  (three required tool calls, their results fed back, then the answer), so a category's
  time is the sessions' time end to end. The steps repeat one tool-call shape within and
  across sessions: what suffix decoding's global trie drafts from the second on. The
  runner adds real agent sessions after them (``bench.agent_tasks``: LangChain's and
  LlamaIndex's agents over our wrappers, timed end to end).

``rag``, ``code_edit`` and ``structured`` repeat long stretches of their prompt (the
JSON keys and copied values of an extraction too), which is where prompt lookup
(n-gram drafting) pays off.

A JSONL file has one JSON object per line with either ``messages`` (OpenAI-style
chat messages), ``prompt`` (plain text) or Spec-Bench's ``turns`` (a list with one
user turn), plus optional ``id``, ``category`` (default ``custom``), ``max_tokens``,
and ``response_format``, ``tools`` and ``tool_choice`` (OpenAI's forms).

A line may also be a recorded model call (``speculative_llm.traces``: it has a ``schema`` key),
as the LangChain and LlamaIndex request recorders write them. A recorded call is
replayed as it was asked: its messages (tool calls and results included), tools,
response format and sampling parameters go into the request unchanged, its own
``max_tokens`` wins over the run's, and each session is a category of its own (its
calls named ``<session>#<call>``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError
from speculative_llm.traces import TraceCall, is_trace_record, parse_trace_record
from speculative_llm.types import GenerationRequest, Message

__all__ = [
    "CATEGORIES",
    "BenchPrompt",
    "builtin_prompts",
    "load_prompts",
    "parse_categories",
    "parse_prompt",
    "select_prompts",
    "trace_prompt",
]

CATEGORIES: tuple[str, ...] = (
    "multi_turn",
    "translation",
    "summarization",
    "qa",
    "math_reasoning",
    "rag",
    "code_edit",
    "structured",
    "structured_free",
    "agent_loop",
)
"""Categories of the built-in prompt set, in report order."""

_FREE_TWIN = {"structured": "structured_free"}
"""Built-in categories whose prompts are also run without their constraints, and where."""

_CATEGORY_ALIASES: dict[str, str] = {
    "mt_bench": "multi_turn",
    "multi-turn": "multi_turn",
    "summarisation": "summarization",
    "math": "math_reasoning",
    "code": "code_edit",
    "code-edit": "code_edit",
    "extraction": "rag",
    "agent": "agent_loop",
    "agent-loop": "agent_loop",
}
"""Spec-Bench's and common alternative spellings of the category names."""

_ROLES = ("system", "user", "assistant")


@dataclass(frozen=True, slots=True)
class BenchPrompt:
    """One benchmark prompt.

    Attributes:
        id: Unique name, for example ``code_edit-03``.
        category: Category it is reported under.
        messages: Chat messages (the model answers the last user turn), or None.
        prompt: Plain-text prompt, when ``messages`` is None.
        max_tokens: This prompt's own generation budget (None: the run's).
        response_format: OpenAI ``response_format`` the answer must follow, or None.
        tools: Tools (OpenAI format) the model may call, or None.
        tool_choice: ``auto``, ``required``, ``none`` or a named tool, with ``tools``.
        agent: For an agent session (``bench.agent_tasks``), the framework whose agent
            answers the user turn with the bench's tools, over several model calls;
            None for a single generation.
        temperature: Sampling temperature (None: greedy, as every built-in prompt).
        top_p: Nucleus sampling mass (None: the default, 1).
        top_k: Top-k (None: the default, off).
        stop: Stop strings.
        seed: Sampling seed, or None.
        recorded: A recorded model call (``speculative_llm.traces``), replayed as it was asked:
            its own ``max_tokens`` wins over the run's.
    """

    id: str
    category: str
    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    max_tokens: int | None = None
    response_format: dict[str, Any] | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: str | dict[str, Any] | None = None
    agent: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    recorded: bool = False

    @property
    def greedy(self) -> bool:
        """Whether the prompt decodes greedily (its outputs can be compared token by token)."""
        return not self.temperature

    def request(self, max_tokens: int, spec: SpecConfig | None) -> GenerationRequest:
        """The request for this prompt: greedy unless it says otherwise.

        Its own ``max_tokens`` caps the run's; a recorded call's own ``max_tokens``
        replaces the run's (which applies only where the call set none).
        """
        if self.max_tokens is None:
            budget = max_tokens
        elif self.recorded:
            budget = self.max_tokens
        else:
            budget = min(max_tokens, self.max_tokens)
        sampling = {
            name: value
            for name in ("top_p", "top_k", "seed")
            if (value := getattr(self, name)) is not None
        }
        return GenerationRequest(
            messages=self.messages,
            prompt=self.prompt,
            max_tokens=budget,
            temperature=0.0 if self.temperature is None else self.temperature,
            stop=self.stop,
            spec=spec,
            response_format=self.response_format,
            tools=self.tools,
            tool_choice=self.tool_choice,
            **sampling,
        )

    def without_constraints(self, category: str) -> BenchPrompt:
        """The same prompt, free of schema and tools, reported under ``category``."""
        return dataclasses.replace(
            self,
            id=f"{self.id}-free",
            category=category,
            response_format=None,
            tools=None,
            tool_choice=None,
        )

    def chat_messages(self) -> list[dict[str, str]]:
        """The messages as OpenAI-style dicts (for tokenizers' chat templates)."""
        if self.messages is None:
            raise ConfigError(f"prompt {self.id!r} has no chat messages.", field="messages")
        return [{"role": m.role, "content": m.content} for m in self.messages]


def _normalize_category(name: str) -> str:
    key = name.strip().lower()
    return _CATEGORY_ALIASES.get(key, key)


def _parse_messages(value: Any, where: str) -> tuple[Message, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: 'messages' must be a non-empty list.", field="messages")
    messages: list[Message] = []
    for index, item in enumerate(value):
        if not isinstance(item, Mapping) or not isinstance(item.get("content"), str):
            raise ConfigError(
                f"{where}: messages[{index}] must be an object with 'role' and a string 'content'.",
                field="messages",
            )
        role = item.get("role")
        if role not in _ROLES:
            raise ConfigError(
                f"{where}: messages[{index}] has role {role!r}; use system, user or assistant.",
                field="messages",
            )
        messages.append(Message(role=role, content=item["content"]))
    if messages[-1].role != "user":
        raise ConfigError(
            f"{where}: the last message must come from the user (the model answers it).",
            field="messages",
        )
    return tuple(messages)


def parse_prompt(record: Mapping[str, Any], *, where: str, default_id: str) -> BenchPrompt:
    """Build a ``BenchPrompt`` from one decoded JSONL record.

    Args:
        record: The decoded object.
        where: Location for error messages (``file.jsonl:12``).
        default_id: Id used when the record has none.

    Raises:
        ConfigError: The record has none or several of ``messages``/``prompt``/``turns``,
            or a malformed value; the message says where and what to write instead.
    """
    if not isinstance(record, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(record).__name__}.")
    given = [key for key in ("messages", "prompt", "turns") if key in record]
    if len(given) != 1:
        raise ConfigError(
            f"{where}: give exactly one of 'messages' (chat), 'prompt' (plain text) or "
            f"'turns' (Spec-Bench), found {given or 'none'}.",
            field="messages",
        )
    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    if "messages" in record:
        messages = _parse_messages(record["messages"], where)
    elif "prompt" in record:
        prompt = record["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError(f"{where}: 'prompt' must be a non-empty string.", field="prompt")
    else:
        turns = record["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise ConfigError(f"{where}: 'turns' must be a list of strings.", field="turns")
        if len(turns) > 1:
            raise ConfigError(
                f"{where}: {len(turns)} turns. A benchmark prompt is one generation: write "
                "the earlier turns and their answers as 'messages' (user, assistant, ..., "
                "user).",
                field="turns",
            )
        messages = (Message(role="user", content=turns[0]),)
    max_tokens = record.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0
    ):
        raise ConfigError(
            f"{where}: 'max_tokens' must be a positive integer, got {max_tokens!r}.",
            field="max_tokens",
        )
    response_format = record.get("response_format")
    if response_format is not None and not isinstance(response_format, Mapping):
        raise ConfigError(
            f"{where}: 'response_format' must be an object, for example "
            '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}.',
            field="response_format",
        )
    tools = record.get("tools")
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, Mapping) for t in tools)
    ):
        raise ConfigError(f"{where}: 'tools' must be a list of OpenAI tool objects.", field="tools")
    raw_id = record.get("id", record.get("question_id", default_id))
    category = record.get("category", "custom")
    if not isinstance(category, str) or not category.strip():
        raise ConfigError(f"{where}: 'category' must be a non-empty string.", field="category")
    return BenchPrompt(
        id=str(raw_id),
        category=_normalize_category(category),
        messages=messages,
        prompt=prompt,
        max_tokens=max_tokens,
        response_format=None if response_format is None else dict(response_format),
        tools=None if tools is None else tuple(dict(t) for t in tools),
        tool_choice=record.get("tool_choice"),
    )


def _read_jsonl(lines: Iterable[str], source: str) -> list[BenchPrompt]:
    prompts: list[BenchPrompt] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"{where}: not valid JSON ({error.msg}). A recording cut short leaves a "
                "partial last line: delete it.",
                field="prompts",
            ) from error
        if is_trace_record(record):
            prompts.append(trace_prompt(parse_trace_record(record, where=where)))
        else:
            prompts.append(parse_prompt(record, where=where, default_id=f"prompt-{number}"))
    seen: set[str] = set()
    for item in prompts:
        if item.id in seen:
            what = "recorded call" if item.recorded else "prompt"
            raise ConfigError(
                f"{source}: the id {item.id!r} is used twice; give every {what} its own "
                + ("session name or call number." if item.recorded else "id."),
                field="prompts",
            )
        seen.add(item.id)
    return prompts


def trace_prompt(traced: TraceCall) -> BenchPrompt:
    """The ``BenchPrompt`` that replays a recorded call, in a category named after its session."""
    return BenchPrompt(
        id=f"{traced.session}#{traced.call}",
        category=traced.session,
        messages=traced.messages,
        prompt=traced.prompt,
        max_tokens=traced.max_tokens,
        response_format=traced.response_format,
        tools=traced.tools,
        tool_choice=traced.tool_choice,
        temperature=traced.temperature,
        top_p=traced.top_p,
        top_k=traced.top_k,
        stop=traced.stop,
        seed=traced.seed,
        recorded=True,
    )


def load_prompts(path: str | Path) -> list[BenchPrompt]:
    """Read a JSONL prompt file (see the module docstring for its format).

    Raises:
        ConfigError: The file is missing, empty or has a malformed line (named).
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigError(
            f"Prompt file {str(file)!r} does not exist. Give a JSONL file with one object per "
            'line, for example {"category": "qa", "messages": [{"role": "user", '
            '"content": "..."}]}.',
            field="prompts",
        )
    with file.open(encoding="utf-8") as handle:
        prompts = _read_jsonl(handle, str(file))
    if not prompts:
        raise ConfigError(f"Prompt file {str(file)!r} has no prompts.", field="prompts")
    return prompts


def builtin_prompts(categories: Sequence[str] | None = None) -> list[BenchPrompt]:
    """The built-in prompts of ``categories`` (all by default), in category order."""
    wanted = CATEGORIES if categories is None else parse_categories(categories, CATEGORIES)
    folder = resources.files("speculative_llm.bench").joinpath("prompts")
    twins = {free: constrained for constrained, free in _FREE_TWIN.items()}
    prompts: list[BenchPrompt] = []
    for category in wanted:
        source = twins.get(category, category)
        text = folder.joinpath(f"{source}.jsonl").read_text(encoding="utf-8")
        read = _read_jsonl(text.splitlines(), f"built-in {source}.jsonl")
        if category in twins:
            read = [prompt.without_constraints(category) for prompt in read]
        prompts.extend(read)
    return prompts


def parse_categories(value: str | Sequence[str], available: Sequence[str]) -> tuple[str, ...]:
    """Resolve ``all`` or a comma-separated list (or a sequence) of category names.

    Raises:
        ConfigError: A name is not among ``available`` (the message lists them).
    """
    names = value.split(",") if isinstance(value, str) else list(value)
    # A recorded session's name is matched as written before any alias applies.
    names = [
        name.strip() if name.strip() in available else _normalize_category(name)
        for name in names
        if name.strip()
    ]
    if not names or names == ["all"]:
        return tuple(available)
    unknown = [name for name in names if name not in available]
    if unknown:
        raise ConfigError(
            f"Unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}. "
            f"Choose 'all' or among: {', '.join(available)}.",
            field="categories",
        )
    return tuple(dict.fromkeys(names))


def select_prompts(
    prompts: Sequence[BenchPrompt],
    categories: str | Sequence[str] = "all",
    per_category: int | None = None,
) -> list[BenchPrompt]:
    """Keep the prompts of some categories, at most ``per_category`` of each.

    Categories keep the order of their first appearance in ``prompts``.

    Raises:
        ConfigError: An unknown category, or ``per_category`` < 1.
    """
    if per_category is not None and per_category < 1:
        raise ConfigError(f"per_category must be >= 1, got {per_category}.", field="per_category")
    available = tuple(dict.fromkeys(p.category for p in prompts))
    wanted = parse_categories(categories, available)
    selected: list[BenchPrompt] = []
    for category in wanted:
        items = [p for p in prompts if p.category == category]
        selected.extend(items if per_category is None else items[:per_category])
    return selected
