"""What each example notebook's words say is what its outputs show.

The notebooks in examples/ are committed with the outputs of one run
(examples/execute_notebooks.py). A reader trusts the prose beside those outputs, so:

* every notebook (``NOTEBOOK_RULES``): a figure the prose quotes (a speedup such as
  ``1.05x``, a rate in tokens/s, a percentage) is one its outputs show, or a ``CLAIMS``
  entry checks it; no float16/bfloat16 explanation stands beside runs of a quantised
  GGUF; the expected-speedup formula shown is the one the code computes
  (``speculative_llm.prediction.FORMULA``), not Leviathan et al.'s; the code drafts with
  the library's default, cost-aware policy, except in a cell that says it pins fixed
  drafts for contrast.
* ``CLAIMS``: a sentence of a notebook's prose, quoted word for word (rewording it
  brings the reader here), and a check of the outputs that makes it true. Figures are
  printed by the code, not typed into the prose; the prose states what they show, and
  the check reads them.

A rule or claim is ``stable`` (the words and code, what the model wrote: its answers, its
tool calls; the data) or ``machine`` (timings, and what depends on the CPU's kernels).
Both kinds are checked here against the committed run, made on a quiet machine.
After a re-run, a failing check says which words no longer match the outputs: change the
words (or the task) and run the notebook again. tests/integration/test_notebooks.py
applies the same checks to a fresh run: there ``stable`` ones must hold, and ``machine``
ones that do not hold on that machine (a busy CI runner, another CPU) are reported as
warnings.

Read as JSON: no Jupyter package is needed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from speculative_llm.prediction import FORMULA

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
REFRESH = "run `python examples/execute_notebooks.py examples/{name}`"


# ---- reading a notebook -------------------------------------------------------------------


def _text(value: str | Sequence[str]) -> str:
    return value if isinstance(value, str) else "".join(value)


def _squash(text: str) -> str:
    """Whitespace collapsed, so a sentence matches however the prose wraps it."""
    return " ".join(text.split())


@dataclass(frozen=True)
class Run:
    """One notebook: its prose and what its code cells printed.

    ``cells`` are the notebook's cells as JSON dicts (or nbformat's nodes, which are
    dicts too), so the committed file and a fresh in-memory run read the same way.
    """

    name: str
    cells: Sequence[Mapping[str, Any]]

    @classmethod
    def load(cls, path: Path) -> Run:
        """The committed notebook at ``path``."""
        notebook = json.loads(path.read_text(encoding="utf-8"))
        return cls(path.name, notebook["cells"])

    def _of(self, kind: str) -> list[Mapping[str, Any]]:
        return [cell for cell in self.cells if cell["cell_type"] == kind]

    @property
    def prose(self) -> str:
        """Every markdown cell, whitespace collapsed."""
        return _squash("\n\n".join(_text(cell["source"]) for cell in self._of("markdown")))

    @property
    def prose_outside_code(self) -> str:
        """The prose without its fenced code blocks (command lines) and inline code."""
        text = "\n\n".join(_text(cell["source"]) for cell in self._of("markdown"))
        text = re.sub(r"```.*?```", " ", text, flags=re.DOTALL)
        return _squash(re.sub(r"`[^`]*`", " ", text))

    @property
    def code_sources(self) -> list[str]:
        """The source of every code cell."""
        return [_text(cell["source"]) for cell in self._of("code")]

    @staticmethod
    def _printed(cell: Mapping[str, Any]) -> str:
        """A cell's outputs as text; a stream printed in pieces reads as one."""
        text = ""
        for output in cell.get("outputs", []):
            if output["output_type"] == "stream":
                text += _text(output["text"])
                continue
            if output["output_type"] == "error":
                shown = f"{output.get('ename')}: {output.get('evalue')}"
            else:
                data = output.get("data", {})
                kinds = [kind for kind in ("text/markdown", "text/plain") if kind in data]
                shown = _text(data[kinds[0]]) if kinds else ""
            text += ("" if text.endswith("\n") or not text else "\n") + shown + "\n"
        return text

    @property
    def outputs(self) -> str:
        """Everything the code cells printed or displayed, as text."""
        return "\n".join(self._printed(cell) for cell in self._of("code"))

    def output(self, marker: str) -> str:
        """What the one code cell whose source contains ``marker`` printed."""
        found = [cell for cell in self._of("code") if marker in _text(cell["source"])]
        assert len(found) == 1, (
            f"{self.name}: {len(found)} code cells contain {marker!r}, not one: the claim's "
            "check names a cell that was removed or duplicated"
        )
        printed = self._printed(found[0])
        assert printed.strip(), f"{self.name}: the cell with {marker!r} printed nothing"
        return printed

    def search(self, marker: str, pattern: str) -> re.Match[str]:
        """The first match of ``pattern`` in what the cell with ``marker`` printed."""
        printed = self.output(marker)
        found = re.search(pattern, printed, flags=re.MULTILINE)
        assert found is not None, (
            f"{self.name}: the cell with {marker!r} printed no line matching {pattern!r}:\n"
            f"{printed[:1500]}"
        )
        return found

    def tables(self, marker: str) -> dict[str, list[dict[str, str]]]:
        """The Markdown tables the cell with ``marker`` displayed, by their bold title."""
        tables: dict[str, list[dict[str, str]]] = {}
        for block in re.split(r"(?m)^(?=\*\*)", self.output(marker)):
            title = re.match(r"\*\*(.+?)\*\*", block)
            rows = [line for line in block.splitlines() if line.startswith("|")]
            if title is None or len(rows) < 3:
                continue
            header = [cell.strip() for cell in rows[0].strip("|").split("|")]
            tables[title.group(1)] = [
                dict(zip(header, (cell.strip() for cell in row.strip("|").split("|")), strict=True))
                for row in rows[2:]
            ]
        assert tables, f"{self.name}: the cell with {marker!r} displayed no Markdown table"
        return tables


def times(figure: str) -> float:
    """``1.05x`` as 1.05."""
    assert figure.endswith("x"), f"not a speedup: {figure!r}"
    return float(figure[:-1])


def equal_count(figure: str) -> tuple[int, int]:
    """``3/3`` as (3, 3)."""
    equal, compared = figure.split("/")
    return int(equal), int(compared)


# ---- rules every notebook keeps -------------------------------------------------------------

FIGURE = re.compile(
    r"(?<![\w.])(?:×\s?\d+(?:\.\d+)?"
    r"|\d+(?:\.\d+)?(?:x(?!\w)|×|\s?%|\s(?:tokens/s|tokens per second)))"
)
"""A figure of the kind a run measures: a speedup, a percentage, a rate."""

FLOAT16 = re.compile(r"\bb?float16\b|\bbf16\b|\bfp16\b|\bhalf precision\b", re.IGNORECASE)

LEVIATHAN = re.compile(r"\\alpha\^\{?k\s*\+\s*1|\(\s*k\s*c\s*\+\s*1\s*\)|kc\s*\+\s*1")
"""Leviathan et al.'s wall-time factor, which the code does not compute."""

SPEEDUP_FIGURE = re.compile(r"\b(?:expected|predicted)\b", re.IGNORECASE)

PINNED_DRAFTS = re.compile(
    r"num_speculative_tokens|cost_aware\s*=|\bks\s*=|--k\b|--no-cost-aware|[\"']k[\"']\s*:"
)
"""Code that pins a draft length or the drafting policy instead of using the default."""

CONTRAST = "for contrast"
"""What a code cell that pins fixed drafts says, in a comment, to show that it does."""


def _formula_key(text: str) -> str:
    for noise in ("$", "\\,", "\\;", "\\!", "\\times", "\\cdot", "×", "*", "\\left", "\\right"):
        text = text.replace(noise, "")
    return "".join(text.split())


FORMULA_KEY = _formula_key(FORMULA.split("=", 1)[1])
"""``T/(1+(r+c)d)``: the expected speedup the code computes, however it is typeset."""


def _claimed_text(name: str) -> str:
    return " ".join(claim.says for claim in CLAIMS if claim.notebook == name)


def _shown(figure: str, printed: str) -> bool:
    """Whether ``printed`` shows ``figure``: a speedup or share with its unit, a rate's number."""
    number = re.search(r"\d+(?:\.\d+)?", figure)
    assert number is not None
    if "%" in figure:
        return re.search(rf"(?<![\d.]){re.escape(number.group())}\s?%", printed) is not None
    if "x" in figure or "×" in figure:
        return (
            re.search(
                rf"×\s?{re.escape(number.group())}(?![\d])|(?<![\d.]){re.escape(number.group())}x",
                printed,
            )
            is not None
        )
    return re.search(rf"(?<![\d.]){re.escape(number.group())}(?![\d])", printed) is not None


def check_figures_are_in_the_outputs(run: Run) -> None:
    """Every measured figure the prose quotes is one the outputs show, or a claim checks."""
    claimed, printed = _squash(_claimed_text(run.name)), run.outputs
    missing = [
        figure.group()
        for figure in FIGURE.finditer(run.prose_outside_code)
        if figure.group() not in claimed and not _shown(figure.group(), printed)
    ]
    assert not missing, (
        f"{run.name}: the prose quotes {missing}, which no output shows: quote what the "
        "cells print (better: let the code print the figure and the prose say what it "
        "shows), or add a claim that checks it; " + REFRESH.format(name=run.name)
    )


def check_no_float16_words_beside_gguf_runs(run: Run) -> None:
    """float16/bfloat16 explanations only where a run used that dtype."""
    said = FLOAT16.search(run.prose)
    if said is not None:
        assert FLOAT16.search(run.outputs), (
            f"{run.name}: the prose explains something by {said.group()!r}, but nothing "
            "ran in it (the packaged models are Q4_1/Q4_K_M GGUF files on llama.cpp's "
            "kernels): give the cause the run has"
        )


def check_formula_is_the_one_the_code_uses(run: Run) -> None:
    """The expected speedup is shown as ``FORMULA``, never as Leviathan et al.'s factor."""
    shown = LEVIATHAN.search(run.prose)
    assert shown is None, (
        f"{run.name}: the prose shows Leviathan et al.'s wall-time factor "
        f"({shown.group()!r}); the code computes {FORMULA} (speculative_llm.prediction)"
    )
    if SPEEDUP_FIGURE.search(run.outputs):
        assert FORMULA_KEY in _formula_key(run.prose), (
            f"{run.name}: its outputs show an expected or predicted speedup, but the prose "
            f"does not give the formula the code computes, {FORMULA}"
        )


def check_code_drafts_with_the_default_policy(run: Run) -> None:
    """Pinned drafts only in a cell that says it shows them for contrast."""
    for index, source in enumerate(run.code_sources):
        pinned = PINNED_DRAFTS.search(source)
        if pinned is not None:
            assert CONTRAST in source and "cost_aware=False" in source, (
                f"{run.name}, code cell {index}: {pinned.group()!r} pins the drafts; use the "
                "default (cost-aware) policy, or show fixed drafts with cost_aware=False in "
                f"a cell whose comment says {CONTRAST!r}"
            )
    for block in re.findall(r"```.*?```", run.prose, flags=re.DOTALL):
        pinned = PINNED_DRAFTS.search(block)
        assert pinned is None, (
            f"{run.name}: a command line in the prose pins the drafts ({pinned.group()!r}); "
            "show the default"
        )


Kind = Literal["stable", "machine"]
"""``stable``: holds wherever the notebook runs (its words and code, the model's answers and
tool calls, the data); ``machine``: timings, and what depends on the CPU's kernels."""

NOTEBOOK_RULES: tuple[tuple[Callable[[Run], None], Kind], ...] = (
    (check_figures_are_in_the_outputs, "machine"),
    (check_no_float16_words_beside_gguf_runs, "stable"),
    (check_formula_is_the_one_the_code_uses, "stable"),
    (check_code_drafts_with_the_default_policy, "stable"),
)


# ---- claims ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """Words of a notebook's prose and the check of its outputs that makes them true.

    Attributes:
        notebook: The notebook's file name.
        says: The words, as the prose has them (whitespace aside).
        check: Raises AssertionError, saying what the outputs show instead.
        kind: ``stable`` or ``machine`` (see ``Kind``).
    """

    notebook: str
    says: str
    check: Callable[[Run], None]
    kind: Kind

    @property
    def id(self) -> str:
        words = re.sub(r"\W+", "-", self.says.lower()).strip("-")
        return f"{self.notebook.removesuffix('.ipynb')}:{words[:48]}"

    def verify(self, run: Run) -> None:
        """The words stand in the prose, and the outputs bear them out."""
        assert _squash(self.says) in run.prose, (
            f"{run.name}: the prose no longer says {self.says!r}; update the claim in "
            "tests/unit/test_notebook_claims.py with the new words and a check that "
            "makes them true"
        )
        try:
            self.check(run)
        except AssertionError as error:
            raise AssertionError(
                f"{run.name} says {self.says!r}, but its outputs do not show it: {error}"
            ) from None


# quickstart.ipynb


def _quickstart_copied_the_list(run: Run) -> None:
    found = run.search("Repeat this list exactly", r"lines of the list copied: (\d+) of (\d+)")
    assert found.group(1) == found.group(2), found.group()


def _quickstart_is_cost_aware_by_default(run: Run) -> None:
    run.search("LocalBackend()", r"default drafting: method 'ngram', cost-aware True, longest")


_POEM_ROW = re.compile(
    r"^\s*(.+?): +([\d.]+) tokens/s, [\d.]+x the baseline; drafted (\d+), accepted (\d+)",
    re.MULTILINE,
)


def _quickstart_rows_cost(run: Run) -> None:
    found = run.search(
        "stats.verify_row_cost", r"r: cost of one more verify row \(passes\): ([\d.]+)"
    )
    assert float(found.group(1)) >= 0.3, found.group()


def _poem_rows(run: Run) -> dict[str, tuple[float, int]]:
    """(median tokens/s, tokens drafted) by configuration, as the poem cell printed them."""
    printed = run.output("Write a short poem about the sea.")
    rows = {
        name.strip(): (float(rate), int(drafted))
        for name, rate, drafted, _ in _POEM_ROW.findall(printed)
    }
    assert {"baseline", "default (cost-aware)"} <= set(rows), printed
    assert any(name.startswith("fixed") for name in rows), printed
    return rows


def _fixed(rows: dict[str, tuple[float, int]]) -> dict[str, tuple[float, int]]:
    return {name: row for name, row in rows.items() if name.startswith("fixed")}


def _quickstart_fixed_drafts_are_slower(run: Run) -> None:
    rows = _poem_rows(run)
    baseline = rows["baseline"][0]
    assert all(rate < baseline for rate, _ in _fixed(rows).values()), rows


def _quickstart_cost_aware_drafts_little(run: Run) -> None:
    _quickstart_is_cost_aware_by_default(run)
    rows = _poem_rows(run)
    rate, drafted = rows["default (cost-aware)"]
    fixed = _fixed(rows).values()
    assert drafted < 0.2 * min(count for _, count in fixed), rows
    assert all(rate > fixed_rate for fixed_rate, _ in fixed), rows
    assert rate >= 0.9 * rows["baseline"][0], rows


def _quickstart_cost_aware_a_little_under(run: Run) -> None:
    rows = _poem_rows(run)
    ratio = rows["default (cost-aware)"][0] / rows["baseline"][0]
    assert 0.9 <= ratio < 1.0, f"the default ran at {ratio:.3f}x the baseline"


# langchain_quickstart.ipynb


def _langchain_quoted(run: Run) -> None:
    run.search("Quote the first sentence", r"^quoted exactly: True")


def _langchain_stream_provenance(run: Run) -> None:
    found = run.search("chat.stream(request)", r"^(\d+) of (\d+) tokens came from the drafter$")
    assert int(found.group(2)) > 0, f"the stream carried no tokens: {found.group()}"


def _langchain_agent(run: Run) -> None:
    printed = run.output("Use the add tool.")
    assert re.search(r"^model calls: add \{'a': 17, 'b': 25\}", printed, re.M), printed
    assert re.search(r"^tool returns: 42$", printed, re.M), printed
    answer = re.findall(r"^ai: (.*)$", printed, re.M)
    assert answer and "42" in answer[-1], f"the answer: {answer}"


# llamaindex_rag.ipynb


def _rag_answers(run: Run) -> dict[str, str]:
    printed = run.output("collect_spec_stats() as collected:\n        response")
    return dict(re.findall(r"^Q: (.+)\nA: (.*)$", printed, re.M))


def _rag_facts(run: Run) -> None:
    answers = _rag_answers(run)
    assert "1889" in answers["When was the Eiffel Tower completed?"], answers
    assert "330 metres" in answers["How tall is the Eiffel Tower?"], answers


def _rag_garbled_definition(run: Run) -> None:
    answer = _rag_answers(run)["What is the acceptance rate?"]
    assert "share of drafted tokens" not in answer, answer


def _rag_stream_provenance(run: Run) -> None:
    found = run.search(
        "llm.stream_chat(messages)", r"^(\d+) of (\d+) tokens came from the drafter$"
    )
    assert int(found.group(2)) > 0, f"the stream carried no tokens: {found.group()}"


def _rag_quote(run: Run) -> None:
    printed = run.output("llm.stream_chat(messages)")
    asked = (
        "It works best when the answer repeats the prompt, as in summarisation, code "
        "editing and retrieval-augmented generation."
    )
    assert asked in printed, printed
    assert "It searches the prompt for the last few generated tokens" in printed, printed


# record_replay.ipynb


def _sessions(run: Run) -> str:
    return run.output("recorder.start_session(session)")


def _replay_sessions_finish(run: Run) -> None:
    printed = _sessions(run)
    assert "stopped at the step cap" not in printed, printed
    assert re.search(r"^sum: calls add\(\{'a': 17, 'b': 25\}\)$", printed, re.M), printed
    assert re.search(r"^product: calls multiply\(\{'a': 6, 'b': 7\}\)$", printed, re.M), printed
    for session in ("sum", "product"):
        assert re.search(rf"^{session}: the tool returns 42$", printed, re.M), printed
        answer = re.search(rf"^{session}: answers (.*)$", printed, re.M)
        assert answer is not None and "42" in answer.group(1), printed


def _replay_answers_run_on(run: Run) -> None:
    answers = re.findall(r"^\w+: answers '(.*)'$", _sessions(run), re.M)
    assert answers, _sessions(run)
    for answer in answers:
        assert len(answer) > 2 * len("42") + 10 and answer.strip() != "42", answers


def _replay_redacted(run: Run) -> None:
    printed = run.output("trace_file.read_text")
    assert "ana@example.com" not in printed and "<email>" in printed, printed[:600]


# benchmark.ipynb and record_replay.ipynb


def _bench_prompt_counts(run: Run) -> None:
    found = run.search("builtin_prompts()", r"^built-in prompts per category: (.+)$")
    counts = {name: int(n) for name, n in re.findall(r"(\w+) (\d+)", found.group(1))}
    assert {"code_edit", "agent_loop", "qa", "rag"} <= set(counts), counts
    assert min(counts.values()) >= 10, counts


def _speculative_rows(run: Run) -> dict[str, list[dict[str, str]]]:
    """The bench tables' rows without the baseline, by category."""
    tables = run.tables("markdown_table(result.summary")
    return {
        category: [row for row in rows if row["variant"] != "none"]
        for category, rows in tables.items()
    }


def _decode_speedups(run: Run) -> dict[str, dict[str, float]]:
    return {
        category: {row["variant"]: times(row["decode speedup"]) for row in rows}
        for category, rows in _speculative_rows(run).items()
    }


def _prediction_inputs(run: Run) -> list[dict[str, float]]:
    printed = run.output("cell.prediction.inputs()")
    found = re.findall(r"T = ([\d.]+), d = ([\d.]+), r = ([\d.]+), c = ([\d.]+)", printed)
    assert found, printed
    return [dict(zip("Tdrc", map(float, row), strict=True)) for row in found]


def _bench_rows_cost_much(run: Run) -> None:
    costs = [inputs["r"] for inputs in _prediction_inputs(run)]
    assert min(costs) >= 0.5, f"r: {costs}"


NEAR_ONE = (0.75, 1.33)
"""What "near the baseline's speed" allows a decode speedup of one short prompt (48 tokens,
three runs): drafting cannot move it further on this CPU, noise moves it this far."""


def _bench_policy_drafts_little(run: Run) -> None:
    drafts = [inputs["d"] for inputs in _prediction_inputs(run)]
    assert max(drafts) < 1.0, f"d: {drafts}"
    _bench_policy_drafts_near_one(run)


def _bench_policy_drafts_near_one(run: Run) -> None:
    far = {
        (category, variant): speedup
        for category, speedups in _decode_speedups(run).items()
        for variant, speedup in speedups.items()
        if not NEAR_ONE[0] <= speedup <= NEAR_ONE[1]
    }
    assert not far, f"decode speedups far from the baseline's: {far}"


def _acceptance(run: Run, category: str) -> float:
    shares = [row["accept"] for row in _speculative_rows(run)[category]]
    return max((float(share.rstrip("%")) for share in shares if share != "-"), default=0.0)


def _bench_rag_accepts_most(run: Run) -> None:
    rag = _acceptance(run, "rag")
    assert rag > _acceptance(run, "qa") and rag >= _acceptance(run, "code_edit"), run.tables(
        "markdown_table(result.summary"
    )


def _prediction_lines(run: Run) -> list[int]:
    """How far off each contender's predictions were, in percent (median over categories)."""
    printed = run.output("prediction_accuracy(result.summary)")
    off = [int(n) for n in re.findall(r"predicted / measured off by (\d+)%", printed)]
    assert off, printed
    return off


def _bench_prediction_lines(run: Run) -> None:
    _prediction_lines(run)


def _bench_no_grammar(run: Run) -> None:
    for category, rows in run.tables("markdown_table(result.summary").items():
        assert all(row["grammar"] == "-" for row in rows), (category, rows)


def _replay_near_one(run: Run) -> None:
    _bench_policy_drafts_near_one(run)


def _replay_predictions_follow(run: Run) -> None:
    off = _prediction_lines(run)
    assert max(off) <= 25, f"predictions off by {off}%"


CLAIMS: tuple[Claim, ...] = (
    Claim(
        "quickstart.ipynb",
        "Here the model is asked to repeat a list, which the 135M model does; the cell "
        "checks the copy line by line.",
        _quickstart_copied_the_list,
        "stable",
    ),
    Claim(
        "quickstart.ipynb",
        "on a CPU a verify row costs a good part of a one-token pass (the $r$ printed above)",
        _quickstart_rows_cost,
        "machine",
    ),
    Claim(
        "quickstart.ipynb",
        "Fixed drafts (`cost_aware=False`, shown here only for contrast) are verified "
        "whatever they are likely to earn, and every verified row costs time: they run "
        "slower than the baseline.",
        _quickstart_fixed_drafts_are_slower,
        "machine",
    ),
    Claim(
        "quickstart.ipynb",
        "The default, cost-aware drafting, drafts only what it expects to pay: a small "
        "fraction of the fixed drafts' tokens, so it runs far faster than they do and near "
        "the baseline's speed.",
        _quickstart_cost_aware_drafts_little,
        "machine",
    ),
    Claim(
        "quickstart.ipynb",
        "It stays a little under the baseline's speed: the few drafts it tries, and looking "
        "them up, cost a little (the package aims at 0.97x the baseline or better where "
        "drafting cannot pay; the cell shows how close the default comes).",
        _quickstart_cost_aware_a_little_under,
        "machine",
    ),
    Claim(
        "benchmark.ipynb",
        "The built-in set has 10 or more prompts in each of Spec-Bench's categories plus "
        "code editing and agent loops (the counts are printed below).",
        _bench_prompt_counts,
        "stable",
    ),
    Claim(
        "benchmark.ipynb",
        "**grammar**: the same for a grammar (none here)",
        _bench_no_grammar,
        "stable",
    ),
    Claim(
        "benchmark.ipynb",
        "On this CPU one more verify row costs a large part of a one-token pass (the $r$ "
        "printed above for every variant and category)",
        _bench_rows_cost_much,
        "machine",
    ),
    Claim(
        "benchmark.ipynb",
        "The cost-aware policy drafts accordingly little, less than one token per verify "
        "step ($d$ above), and the speculative variants decode near the baseline's speed, "
        "above or below it",
        _bench_policy_drafts_little,
        "machine",
    ),
    Claim(
        "benchmark.ipynb",
        "Drafts are accepted most often on the rag prompt, whose answer quotes its "
        "document, and rarely on the open question (qa).",
        _bench_rag_accepts_most,
        "machine",
    ),
    Claim(
        "benchmark.ipynb",
        "the lines under the tables say how far the predicted decode speedups, from the "
        "same run's statistics, were from the measured ones",
        _bench_prediction_lines,
        "stable",
    ),
    Claim(
        "langchain_quickstart.ipynb",
        'every streamed chunk carries `response_metadata["speculative_tokens"]`: the text '
        "and provenance of each of its tokens.",
        _langchain_stream_provenance,
        "stable",
    ),
    Claim(
        "langchain_quickstart.ipynb",
        "Here the model calls `add` with 17 and 25, the tool returns 42, and the answer states 42.",
        _langchain_agent,
        "stable",
    ),
    Claim(
        "llamaindex_rag.ipynb",
        "It takes the Eiffel Tower's year (1889) and height (330 metres) from the "
        "retrieved document",
        _rag_facts,
        "stable",
    ),
    Claim(
        "llamaindex_rag.ipynb",
        "asked for the acceptance rate, it does not give the document's \"share of "
        'drafted tokens the target model accepts"',
        _rag_garbled_definition,
        "stable",
    ),
    Claim(
        "llamaindex_rag.ipynb",
        "Each streamed response from `Speculative` carries the tokens of its piece in "
        '`additional_kwargs["speculative_tokens"]`',
        _rag_stream_provenance,
        "stable",
    ),
    Claim(
        "llamaindex_rag.ipynb",
        "The model quotes the sentence asked for, but not alone: it copies the whole "
        "document around it",
        _rag_quote,
        "stable",
    ),
    Claim(
        "record_replay.ipynb",
        "Both sessions finish: the model calls the tool the question names, with the "
        "question's numbers, the tool returns 42, and the answer states 42.",
        _replay_sessions_finish,
        "stable",
    ),
    Claim(
        "record_replay.ipynb",
        "it repeats itself, or pads the number, until it reaches `max_tokens`",
        _replay_answers_run_on,
        "stable",
    ),
    Claim(
        "record_replay.ipynb",
        "The redaction hook here masks e-mail addresses",
        _replay_redacted,
        "stable",
    ),
    Claim(
        "record_replay.ipynb",
        "the decode speedups sit near 1.00x, on either side",
        _replay_near_one,
        "machine",
    ),
    Claim(
        "record_replay.ipynb",
        "the prediction from each session's own statistics follows the measurement",
        _replay_predictions_follow,
        "machine",
    ),
)


# ---- the tests ------------------------------------------------------------------------------


def test_examples_folder_has_notebooks() -> None:
    assert {"quickstart.ipynb", "benchmark.ipynb"} <= {path.name for path in NOTEBOOKS}


RULES = [rule for rule, _ in NOTEBOOK_RULES]


@pytest.mark.parametrize("rule", RULES, ids=[rule.__name__ for rule in RULES])
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def test_notebook_keeps_the_rule(path: Path, rule: Callable[[Run], None]) -> None:
    rule(Run.load(path))


@pytest.mark.parametrize("claim", CLAIMS, ids=[claim.id for claim in CLAIMS])
def test_claim_is_in_the_prose_and_true_of_the_outputs(claim: Claim) -> None:
    claim.verify(Run.load(EXAMPLES / claim.notebook))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[path.name for path in NOTEBOOKS])
def test_every_notebook_has_its_claims_checked(path: Path) -> None:
    assert any(claim.notebook == path.name for claim in CLAIMS), (
        f"{path.name}: no claim of its prose is checked against its outputs: add one to CLAIMS"
    )


def test_claims_name_notebooks_that_exist() -> None:
    names = {path.name for path in NOTEBOOKS}
    assert {claim.notebook for claim in CLAIMS} <= names
