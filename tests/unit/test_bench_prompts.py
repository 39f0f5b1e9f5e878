"""The built-in prompt set and JSONL prompt files."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from speculative_llm.bench.prompts import (
    CATEGORIES,
    BenchPrompt,
    builtin_prompts,
    load_prompts,
    parse_categories,
    select_prompts,
)
from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError
from speculative_llm.types import Message


def _write(path: Path, records: list[object]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    return path


def test_builtin_set_has_ten_or_more_prompts_in_every_spec_bench_category() -> None:
    prompts = builtin_prompts()
    for category in CATEGORIES:
        count = sum(1 for p in prompts if p.category == category)
        assert count >= 10, f"{category} has {count} prompts"
    assert {p.category for p in prompts} == set(CATEGORIES)
    assert len({p.id for p in prompts}) == len(prompts)


def test_builtin_prompts_end_with_a_user_turn_and_multi_turn_has_history() -> None:
    prompts = builtin_prompts()
    for prompt in prompts:
        assert prompt.messages is not None
        assert prompt.messages[-1].role == "user"
    multi_turn = [p for p in prompts if p.category == "multi_turn"]
    assert all(
        p.messages is not None and any(m.role == "assistant" for m in p.messages)
        for p in multi_turn
    )


def test_code_edit_and_rag_prompts_are_long_enough_for_prompt_lookup() -> None:
    prompts = builtin_prompts(["code_edit", "rag", "qa"])
    length = {p.id: sum(len(m.content) for m in p.messages or ()) for p in prompts}
    for prompt in prompts:
        if prompt.category in ("code_edit", "rag"):
            assert length[prompt.id] > 900, prompt.id
    mean = {
        c: sum(length[p.id] for p in prompts if p.category == c)
        / sum(1 for p in prompts if p.category == c)
        for c in ("code_edit", "rag", "qa")
    }
    assert mean["code_edit"] > 5 * mean["qa"]
    assert mean["rag"] > 5 * mean["qa"]


def test_builtin_prompts_filters_categories_in_requested_order() -> None:
    prompts = builtin_prompts(["rag", "qa"])
    assert prompts[0].category == "rag"
    assert {p.category for p in prompts} == {"rag", "qa"}


def test_request_is_greedy_with_the_spec_and_the_smaller_budget() -> None:
    prompt = BenchPrompt(id="a", category="qa", messages=(Message("user", "hi"),), max_tokens=10)
    spec = SpecConfig(method="ngram", num_speculative_tokens=3)
    request = prompt.request(64, spec)
    assert request.max_tokens == 10
    assert request.temperature == 0.0
    assert request.spec == spec
    assert prompt.request(4, None).max_tokens == 4


def test_load_prompts_reads_messages_prompt_and_spec_bench_turns(tmp_path: Path) -> None:
    path = _write(
        tmp_path / "p.jsonl",
        [
            {"id": "m", "category": "code_edit", "messages": [{"role": "user", "content": "x"}]},
            {"prompt": "Once upon a time", "max_tokens": 7},
            {"question_id": 81, "category": "mt_bench", "turns": ["Plan a trip."]},
        ],
    )
    prompts = load_prompts(path)
    assert [p.id for p in prompts] == ["m", "prompt-2", "81"]
    assert prompts[1].prompt == "Once upon a time"
    assert prompts[1].max_tokens == 7
    assert prompts[1].category == "custom"
    assert prompts[2].category == "multi_turn"
    assert prompts[2].messages == (Message("user", "Plan a trip."),)


@pytest.mark.parametrize(
    ("record", "fragment"),
    [
        ({"category": "qa"}, "exactly one of"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "exactly one of"),
        ({"prompt": "  "}, "non-empty string"),
        ({"turns": ["a", "b"]}, "write the earlier turns"),
        (
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]},
            "last message must come from the user",
        ),
        ({"messages": [{"role": "robot", "content": "q"}]}, "role 'robot'"),
        ({"messages": [{"role": "user"}]}, "string 'content'"),
        ({"prompt": "a", "max_tokens": 0}, "positive integer"),
        ({"prompt": "a", "category": ""}, "'category'"),
    ],
)
def test_load_prompts_names_the_line_and_the_problem(
    tmp_path: Path, record: dict[str, object], fragment: str
) -> None:
    path = _write(tmp_path / "bad.jsonl", [{"prompt": "fine"}, record])
    with pytest.raises(ConfigError) as error:
        load_prompts(path)
    assert f"{path}:2" in str(error.value)
    assert fragment in str(error.value)


def test_load_prompts_rejects_invalid_json_duplicates_missing_and_empty_files(
    tmp_path: Path,
) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": "a"}\n{not json\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"broken.jsonl:2: not valid JSON"):
        load_prompts(broken)
    duplicate = _write(
        tmp_path / "dup.jsonl", [{"id": "x", "prompt": "a"}, {"id": "x", "prompt": "b"}]
    )
    with pytest.raises(ConfigError, match="used twice"):
        load_prompts(duplicate)
    with pytest.raises(ConfigError, match="does not exist"):
        load_prompts(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="has no prompts"):
        load_prompts(empty)


def test_parse_categories_all_aliases_and_unknown() -> None:
    assert parse_categories("all", CATEGORIES) == CATEGORIES
    assert parse_categories("code,mt_bench,qa,qa", CATEGORIES) == ("code_edit", "multi_turn", "qa")
    with pytest.raises(ConfigError, match=r"Unknown category poetry.*Choose 'all'"):
        parse_categories("qa,poetry", CATEGORIES)


def test_select_prompts_caps_each_category() -> None:
    prompts = builtin_prompts()
    chosen = select_prompts(prompts, "all", per_category=2)
    assert len(chosen) == 2 * len(CATEGORIES)
    assert [p.category for p in chosen[:2]] == [CATEGORIES[0]] * 2
    only = select_prompts(prompts, "rag,code_edit", per_category=1)
    assert [p.category for p in only] == ["rag", "code_edit"]
    with pytest.raises(ConfigError, match="per_category must be >= 1"):
        select_prompts(prompts, "all", per_category=0)


def test_structured_prompts_carry_their_constraints_and_have_free_twins() -> None:
    from speculative_llm.bench.prompts import builtin_prompts

    constrained = builtin_prompts(["structured"])
    free = builtin_prompts(["structured_free"])
    assert len(constrained) == len(free) >= 10
    assert all(p.response_format or p.tools for p in constrained)
    for prompt, twin in zip(constrained, free, strict=True):
        assert twin.id == f"{prompt.id}-free" and twin.messages == prompt.messages
        assert twin.response_format is None and twin.tools is None and twin.tool_choice is None
    request = next(p for p in constrained if p.tools).request(64, None)
    assert request.tools and request.tool_choice == "required"


def test_a_jsonl_prompt_may_carry_response_format_and_tools(tmp_path: Path) -> None:
    from speculative_llm.bench.prompts import load_prompts

    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"id": "a", "messages": [{"role": "user", "content": "x"}], '
        '"response_format": {"type": "json_object"}}\n'
        '{"id": "b", "messages": [{"role": "user", "content": "y"}], "tools": 3}\n'
    )
    with pytest.raises(ConfigError, match="'tools' must be a list") as caught:
        load_prompts(path)
    assert caught.value.field == "tools"
    path.write_text(path.read_text().splitlines()[0] + "\n")
    (prompt,) = load_prompts(path)
    assert prompt.request(8, None).response_format == {"type": "json_object"}


def test_agent_loop_sessions_run_their_steps_in_order() -> None:
    """Each step is the previous one plus its tool call and result: one agent, end to end."""
    steps = builtin_prompts(["agent_loop"])
    sessions: dict[str, list[BenchPrompt]] = {}
    for prompt in steps:
        sessions.setdefault(prompt.id.rsplit("-", 1)[0], []).append(prompt)
    assert len(sessions) >= 3
    for session in sessions.values():
        assert [p.id.rsplit("-", 1)[1] for p in session] == [
            str(n) for n in range(1, len(session) + 1)
        ]
        for earlier, later in itertools.pairwise(session):
            assert earlier.messages is not None and later.messages is not None
            assert later.messages[: len(earlier.messages)] == earlier.messages
            assert [m.role for m in later.messages[len(earlier.messages) :]] == [
                "assistant",
                "user",
            ]
        *calls, answer = session
        assert all(p.tools and p.tool_choice == "required" for p in calls)
        assert answer.tools is None  # the last step answers from the tool results
