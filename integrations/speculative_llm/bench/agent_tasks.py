"""The agent sessions of the ``agent_loop`` category: questions, typed tools, frameworks.

A session is one question answered by a real agent of a framework over our wrappers:
LangChain's ``create_agent`` (``ChatSpeculative``) or LlamaIndex's ``FunctionAgent``
(``Speculative``), with the three typed tools below. The agent calls tools, reads their
results and answers, over several model calls; the bench times the session end to end
and counts its calls. The questions run one after another on the same backend, so
suffix decoding's global trie learns the tool-call shape from one session to the next.

The tools answer from fixed tables and never raise: a small model calls them
imperfectly (an unknown city, a made-up currency), and a session must go on with what
the tool said rather than crash the run.

Nothing here imports a framework: ``bench.agents`` does, when a session runs.
"""

# No ``from __future__ import annotations``: LlamaIndex's FunctionTool builds its schema
# from the tools' annotations as objects (a string "Literal[...]" would not resolve).
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from speculative_llm.bench.prompts import BenchPrompt
from speculative_llm.errors import ConfigError
from speculative_llm.types import Message

__all__ = [
    "AGENT_CATEGORY",
    "AGENT_FRAMEWORKS",
    "AGENT_MAX_STEPS",
    "AGENT_MAX_TOKENS",
    "AGENT_QUESTIONS",
    "AGENT_SYSTEM_PROMPT",
    "AGENT_TOOLS",
    "AgentQuestion",
    "agent_prompts",
    "convert_currency",
    "get_weather",
    "parse_frameworks",
    "search_flights",
]

AGENT_CATEGORY = "agent_loop"
"""The category agent sessions are reported under (with the scripted steps)."""

AGENT_FRAMEWORKS: tuple[str, ...] = ("langchain", "llama_index")
"""Frameworks whose agents the bench runs: ``create_agent`` and ``FunctionAgent``."""

_FRAMEWORK_ALIASES = {
    "langchain": "langchain",
    "create_agent": "langchain",
    "llama_index": "llama_index",
    "llama-index": "llama_index",
    "llamaindex": "llama_index",
    "functionagent": "llama_index",
}

AGENT_MAX_TOKENS = 64
"""Generation budget of one model call of a session (a tool call fits in about 40)."""

AGENT_MAX_STEPS = 4
"""Most model calls of one session: three tool calls and the answer."""

AGENT_SYSTEM_PROMPT = (
    "You are a travel assistant. Call each tool once, one call per turn: first get_weather, "
    "then convert_currency, then search_flights. When you have the three results, answer "
    "the user in two sentences."
)


@dataclass(frozen=True, slots=True)
class AgentQuestion:
    """One user question of the agent sessions.

    Attributes:
        id: Short name, part of the session's prompt id (``agent_loop-langchain-lisbon``).
        text: What the user asks.
    """

    id: str
    text: str


AGENT_QUESTIONS: tuple[AgentQuestion, ...] = (
    AgentQuestion(
        "lisbon",
        "I fly from New York (JFK) to Lisbon (LIS) on 2026-03-14 with 800 US dollars. What "
        "is the weather in Lisbon, what is my money in euros, and which flights are there?",
    ),
    AgentQuestion(
        "tokyo",
        "I go from San Francisco (SFO) to Tokyo (HND) on 2026-04-02 with 1500 US dollars. "
        "Tell me the weather in Tokyo, what my dollars are in yen, and the flights that day.",
    ),
    AgentQuestion(
        "denver",
        "I fly from Chicago (ORD) to Denver (DEN) on 2026-02-08. What is the weather there in "
        "fahrenheit, what are 300 US dollars in Canadian dollars, and which flights are there?",
    ),
    AgentQuestion(
        "rome",
        "I travel from London (LHR) to Rome (FCO) on 2026-05-20 with 600 British pounds. "
        "What is the weather in Rome, how many euros do I get, and which flights are there?",
    ),
)
"""The questions, in the order sessions run (``--agent-questions`` takes the first n)."""

_WEATHER: dict[str, tuple[float, str]] = {
    "lisbon": (17.0, "sunny"),
    "tokyo": (15.0, "clear"),
    "denver": (5.0, "sunny"),
    "rome": (22.0, "partly cloudy"),
    "new york": (8.0, "rain"),
    "london": (11.0, "overcast"),
}
"""City: (temperature in Celsius, conditions)."""

_USD_RATES: dict[str, float] = {
    "USD": 1.0,
    "EUR": 0.921,
    "JPY": 149.1,
    "CAD": 1.362,
    "GBP": 0.786,
}
"""Units of each currency per US dollar."""

_FLIGHTS: dict[tuple[str, str], tuple[tuple[str, str, str, int], ...]] = {
    ("JFK", "LIS"): (("TP 208", "18:30", "06:45", 612), ("UA 64", "21:10", "09:20", 655)),
    ("SFO", "HND"): (("NH 7", "11:05", "15:20", 1032), ("UA 837", "13:00", "17:05", 968)),
    ("ORD", "DEN"): (("UA 1431", "07:15", "08:55", 159), ("WN 2210", "10:40", "12:25", 132)),
    ("LHR", "FCO"): (("BA 548", "08:25", "11:55", 142), ("AZ 201", "12:10", "15:40", 128)),
}
"""(origin, destination): (flight, departs, arrives, price in US dollars)."""


_CONDITIONS = ("sunny", "clear", "cloudy", "rain", "windy")


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Current weather in a city, in celsius or fahrenheit."""
    name = str(city).strip().lower()
    known = _WEATHER.get(name)
    if known is None:
        # Any other place (an airport code, a misspelling) gets weather too, the same
        # every run: an error would only make a small model call again.
        seed = sum(ord(character) for character in name)
        known = (float(seed % 25), _CONDITIONS[seed % len(_CONDITIONS)])
    celsius, conditions = known
    temperature = celsius * 9 / 5 + 32 if unit == "fahrenheit" else celsius
    return json.dumps(
        {
            "city": city,
            "temperature": round(temperature),
            "unit": "fahrenheit" if unit == "fahrenheit" else "celsius",
            "conditions": conditions,
        }
    )


def convert_currency(amount: float, source: str, target: str) -> str:
    """Convert an amount of money from one ISO currency code (e.g. USD) to another (EUR)."""
    source_rate = _USD_RATES.get(str(source).strip().upper())
    target_rate = _USD_RATES.get(str(target).strip().upper())
    if source_rate is None or target_rate is None:
        return json.dumps(
            {"error": f"unknown currency; use one of {', '.join(_USD_RATES)}"},
        )
    try:
        value = float(amount)
    except (TypeError, ValueError):
        return json.dumps({"error": f"amount must be a number, got {amount!r}"})
    rate = target_rate / source_rate
    return json.dumps(
        {"amount": value, "source": source, "target": target, "result": round(value * rate, 2)}
    )


def search_flights(origin: str, destination: str, date: str) -> str:
    """Flights between two IATA airport codes on a date (YYYY-MM-DD)."""
    key = (str(origin).strip().upper(), str(destination).strip().upper())
    flights = _FLIGHTS.get(key, ())
    return json.dumps(
        {
            "date": date,
            "flights": [
                {"number": number, "departs": departs, "arrives": arrives, "price_usd": price}
                for number, departs, arrives, price in flights
            ],
        }
    )


AGENT_TOOLS: tuple[Callable[..., str], ...] = (get_weather, convert_currency, search_flights)
"""The typed tools every session offers (the frameworks read their signatures)."""


def parse_frameworks(value: str | Sequence[str]) -> tuple[str, ...]:
    """Resolve ``langchain,llama_index`` (or a sequence; ``none`` for no sessions).

    Raises:
        ConfigError: An unknown framework name (the message lists the known ones).
    """
    names = value.split(",") if isinstance(value, str) else list(value)
    cleaned = [name.strip().lower() for name in names if name.strip()]
    if cleaned == ["none"]:
        return ()
    unknown = [name for name in cleaned if name not in _FRAMEWORK_ALIASES]
    if unknown:
        raise ConfigError(
            f"Unknown agent framework(s) {', '.join(unknown)}; use a comma-separated list of "
            f"{', '.join(AGENT_FRAMEWORKS)}, or none.",
            field="agent_frameworks",
        )
    return tuple(dict.fromkeys(_FRAMEWORK_ALIASES[name] for name in cleaned))


def agent_prompts(
    frameworks: Sequence[str] = AGENT_FRAMEWORKS,
    questions: int = 3,
    *,
    max_tokens: int = AGENT_MAX_TOKENS,
) -> list[BenchPrompt]:
    """One session per (framework, question): each framework's questions in sequence.

    Args:
        frameworks: Frameworks to run (see ``AGENT_FRAMEWORKS``).
        questions: How many of ``AGENT_QUESTIONS`` each framework answers.
        max_tokens: Generation budget of each model call.

    Raises:
        ConfigError: An unknown framework, or ``questions`` outside 1..len(AGENT_QUESTIONS).
    """
    chosen = parse_frameworks(frameworks)
    if isinstance(questions, bool) or not 1 <= questions <= len(AGENT_QUESTIONS):
        raise ConfigError(
            f"agent_questions must be between 1 and {len(AGENT_QUESTIONS)}, got {questions!r}.",
            field="agent_questions",
        )
    return [
        BenchPrompt(
            id=f"{AGENT_CATEGORY}-{framework}-{question.id}",
            category=AGENT_CATEGORY,
            messages=(
                Message(role="system", content=AGENT_SYSTEM_PROMPT),
                Message(role="user", content=question.text),
            ),
            max_tokens=max_tokens,
            agent=framework,
        )
        for framework in chosen
        for question in AGENT_QUESTIONS[:questions]
    ]
