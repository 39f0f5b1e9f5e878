"""Ready-made prompts, grouped by the kind of task.

Prompt lookup (n-gram drafting) pays off when the answer repeats long spans of the
prompt: editing code, extracting facts quoted from a document, rewriting a text. Free
generation (chat, open questions) gives a drafter with no model of its own little to
copy, which is worth seeing too: the presets cover both ends. The agent-loop steps
repeat one tool-call shape across requests: suffix decoding's global trie drafts it
from the second step on.
"""

from __future__ import annotations

from dataclasses import dataclass

from speculative_llm.errors import ConfigError

__all__ = ["CATEGORIES", "CUSTOM", "PRESETS", "Preset", "find_preset", "preset_names"]

CUSTOM = "Custom prompt"
"""What the preset picker shows once the prompt (or schema) has been edited by hand."""


@dataclass(frozen=True, slots=True)
class Preset:
    """One example prompt.

    Attributes:
        name: Short title shown in the preset dropdown (unique).
        category: Task category (one of ``CATEGORIES``).
        prompt: The user message sent to the model.
        why: One sentence on what to expect from speculation on this prompt.
        schema: A JSON schema both sides' answers must follow (empty: free text).
        max_tokens: The token budget the preset sets (None: keep the page's), enough
            for the packaged model to finish the answer.
    """

    name: str
    category: str
    prompt: str
    why: str
    schema: str = ""
    max_tokens: int | None = None


_RETRY_CODE = """def fetch_with_retry(client, url, attempts=3, delay=0.5):
    last_error = None
    for attempt in range(attempts):
        try:
            response = client.get(url, timeout=10)
            response.raise_for_status()
            return response.json()
        except Exception as error:
            last_error = error
            time.sleep(delay * (2 ** attempt))
    raise RuntimeError(f"giving up on {url}") from last_error"""

_INVENTORY_CODE = """class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, quantity):
        self.items[name] = self.items.get(name, 0) + quantity

    def remove(self, name, quantity):
        if self.items.get(name, 0) < quantity:
            raise ValueError("not enough " + name)
        self.items[name] -= quantity

    def total(self):
        return sum(self.items.values())"""

_INCIDENT_REPORT = """Incident report INC-2291, filed 14 March 2025 by Dana Whitfield (site
reliability). At 09:42 UTC the payments API in region eu-west-1 began returning HTTP 503 errors for
about 18% of requests. The on-call engineer, Marco Ruiz, traced the errors to the
connection pool of the ledger database, which had been lowered from 200 to 20
connections by configuration change CHG-7810 the evening before. The change was
reverted at 10:31 UTC and the error rate returned to zero by 10:36 UTC. Roughly
41,000 payment attempts failed; all were retried automatically and no money was
lost. Follow-up actions: add a review step for pool-size changes (owner: Dana
Whitfield, due 28 March 2025) and alert on pool saturation above 80% (owner: Marco
Ruiz, due 21 March 2025)."""

_PRODUCT_DOC = """Context document: The Aurora X2 trail running shoe weighs 268 grams (US men's
size 9) and has a heel-to-toe drop of 6 mm. The midsole is made of a nitrogen-infused
foam called PulseFoam, and the outsole uses Vibram Megagrip rubber with 4 mm lugs.
It is available in widths standard and wide, in sizes US 7 to 14, and costs 165 US
dollars. The upper is a recycled polyester mesh. The manufacturer rates the midsole
for about 700 kilometres of running. Returns are accepted within 60 days if the shoes
have been worn for less than 50 kilometres."""

_NEWS_STORY = """The city council of Lindenfeld voted 7 to 2 on Tuesday to turn the
disused tram depot on Mill Street into a public library and community workshop.
The project will cost an estimated 12.4 million euros, two thirds of which come
from a regional renewal fund. Construction is expected to start next spring and
to take about two years. Supporters said the neighbourhood has had no library
since 2009, when the old branch closed. The two council members who voted against
the plan argued that the money would be better spent on road repairs, and asked
for an independent review of the cost estimate, which the council rejected."""


# Every key is required, so the grammar forces the whole object; the values are the
# report's own words, which is what prompt lookup drafts. Short strings and at most two
# follow-ups keep the answer within the preset's token budget: without them the
# packaged SmolLM2 repeated array items until cut off, mid-string (issue 23).
_INCIDENT_SCHEMA = """{
  "type": "object",
  "properties": {
    "incident_id": {
      "type": "string",
      "maxLength": 16
    },
    "filed_by": {
      "type": "string",
      "maxLength": 24
    },
    "region": {
      "type": "string",
      "maxLength": 16
    },
    "cause": {
      "type": "string",
      "maxLength": 80
    },
    "fixed_at": {
      "type": "string",
      "maxLength": 16
    },
    "failed_payments": {
      "type": "integer"
    },
    "follow_up_actions": {
      "type": "array",
      "maxItems": 2,
      "items": {
        "type": "object",
        "properties": {
          "action": {
            "type": "string",
            "maxLength": 60
          },
          "owner": {
            "type": "string",
            "maxLength": 24
          }
        },
        "required": [
          "action",
          "owner"
        ]
      },
      "minItems": 1
    }
  },
  "required": [
    "incident_id",
    "filed_by",
    "region",
    "cause",
    "fixed_at",
    "failed_payments",
    "follow_up_actions"
  ]
}"""


_AGENT_TOOLS = """You are the planning step of an agent. Tools:
- get_weather(city: string, unit: "celsius" or "fahrenheit"): current weather in a city.
- convert_currency(amount: number, source: string, target: string): convert money with
  today's rate; currencies are ISO codes such as EUR, USD, NOK.
- search_flights(origin: string, destination: string, date: string): flights on a date
  (YYYY-MM-DD), origin and destination as IATA airport codes.
Reply with exactly one tool call as JSON: {"tool": ..., "arguments": {...}, "reason": ...}.

Question: """

# One tool-call shape for every step, as in an agent loop: what suffix decoding's global
# trie learns from the first answer and drafts in the next ones.
_AGENT_SCHEMA = """{
  "type": "object",
  "properties": {
    "tool": {"type": "string", "enum": ["get_weather", "convert_currency", "search_flights"]},
    "arguments": {
      "type": "object",
      "properties": {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
      },
      "required": ["city", "unit"]
    },
    "reason": {"type": "string"}
  },
  "required": ["tool", "arguments", "reason"]
}"""

_AGENT_WHY = (
    "Run the agent-loop steps in order with method suffix on the local engine: from the "
    "second step on, the global trie drafts the tool-call JSON of the earlier answers "
    "(the statistics count its drafts apart from the request's own)."
)

PRESETS: tuple[Preset, ...] = (
    Preset(
        name="Code edit: add type hints",
        category="Code edit",
        prompt=(
            "Add type hints to this Python function. Do not change anything else, and "
            "reply with the complete function only.\n\n```python\n" + _RETRY_CODE + "\n```"
        ),
        why="The answer copies the function almost verbatim: prompt lookup drafts long runs.",
    ),
    Preset(
        name="Code edit: rename a method",
        category="Code edit",
        prompt=(
            "Rename the method `total` to `total_quantity` in this class and reply with the "
            "whole updated class.\n\n```python\n" + _INVENTORY_CODE + "\n```"
        ),
        why="Almost every output token already appears in the prompt.",
    ),
    Preset(
        name="Summarise a news story",
        category="Summarisation",
        prompt="Summarise this news story in three sentences.\n\n" + _NEWS_STORY,
        why="Summaries reuse names and phrases from the text: some n-gram hits.",
    ),
    Preset(
        name="Extract incident facts",
        category="Extraction / RAG",
        prompt=(
            "From the report below, list: the incident id, who filed it, the region, the "
            "cause, the time it was fixed, and each follow-up action with its owner and due "
            "date. Quote the report's wording.\n\n" + _INCIDENT_REPORT
        ),
        why="Quoted facts are copied from the context: prompt lookup accepts long spans.",
    ),
    Preset(
        name="Answer from a context document",
        category="Extraction / RAG",
        prompt=(
            _PRODUCT_DOC
            + "\n\nUsing only the context document, answer: how much does the Aurora X2 "
            "weigh, what is its drop, what is the midsole made of, and what is the return "
            "policy?"
        ),
        why="Retrieval-augmented answers repeat the retrieved passage.",
    ),
    Preset(
        name="Incident report to JSON",
        category="Structured output",
        prompt=(
            "Extract the facts of this incident report as JSON, quoting the report's "
            "wording.\n\n" + _INCIDENT_REPORT
        ),
        why=(
            "Both sides decode under the JSON schema (see Structured output in the "
            "settings): the grammar forces the keys, and the values are copied from the "
            "report, so prompt lookup drafts them."
        ),
        schema=_INCIDENT_SCHEMA,
        max_tokens=256,  # the packaged SmolLM2 completes the object in about 200
    ),
    Preset(
        name="General knowledge question",
        category="QA",
        prompt="Why is the sky blue? Explain it to a curious twelve-year-old.",
        why="Free text: little to copy, so expect a modest gain from n-gram drafting.",
    ),
    Preset(
        name="Translate to French",
        category="Translation",
        prompt=(
            "Translate into French:\n\nThe meeting is moved to Thursday at 10 am. Please "
            "bring the quarterly report and the updated budget. The meeting room is on the "
            "third floor, next to the kitchen."
        ),
        why="Names and numbers carry over; most words change: a middling case.",
    ),
    Preset(
        name="Word problem",
        category="Math",
        prompt=(
            "A train leaves at 14:20 and travels 186 km at an average of 124 km/h. At what "
            "time does it arrive? Show your working step by step."
        ),
        why="Step-by-step working repeats numbers and phrases it has just written.",
    ),
    Preset(
        name="Agent loop 1/3: weather in Paris",
        category="Agent loop",
        prompt=_AGENT_TOOLS + "Should I take an umbrella in Paris today? Use celsius.",
        why=_AGENT_WHY,
        schema=_AGENT_SCHEMA,
    ),
    Preset(
        name="Agent loop 2/3: weather in Oslo",
        category="Agent loop",
        prompt=_AGENT_TOOLS + "Is it cold enough in Oslo for a winter coat? Use celsius.",
        why=_AGENT_WHY,
        schema=_AGENT_SCHEMA,
    ),
    Preset(
        name="Agent loop 3/3: weather in Denver",
        category="Agent loop",
        prompt=_AGENT_TOOLS + "Will it be warm in Denver this afternoon? Use fahrenheit.",
        why=_AGENT_WHY,
        schema=_AGENT_SCHEMA,
    ),
    Preset(
        name="Friendly chat",
        category="Chat",
        prompt="Hi! Can you suggest three ideas for a rainy Sunday afternoon at home?",
        why="Open-ended chat: the hardest case for a drafter without a model.",
    ),
)
"""Every preset, in the order the dropdown shows them."""

CATEGORIES: tuple[str, ...] = tuple(dict.fromkeys(preset.category for preset in PRESETS))
"""Categories in display order."""


def preset_names(category: str | None = None) -> list[str]:
    """Names of the presets of one category (all presets when ``category`` is None)."""
    return [p.name for p in PRESETS if category is None or p.category == category]


def find_preset(name: str) -> Preset:
    """The preset called ``name``.

    Raises:
        ConfigError: No preset has that name (the message lists them).
    """
    for preset in PRESETS:
        if preset.name == name:
            return preset
    raise ConfigError(
        f"Unknown preset {name!r}. Choose one of: {', '.join(p.name for p in PRESETS)}.",
        field="preset",
    )
