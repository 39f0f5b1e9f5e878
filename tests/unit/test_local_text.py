"""Streaming text assembly: incremental detokenization and stop strings."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers", reason="the local engine needs transformers")

from speculative_llm.engine.request.text import (
    IncrementalDetokenizer,
    OutputText,
    PendingToken,
    StopStringFilter,
)
from speculative_llm.types import Token


@pytest.fixture(scope="module")
def byte_level_tokenizer() -> Any:
    """A byte-level BPE (like GPT-2's and SmolLM2's) trained on ASCII text, offline."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(
        ["the quick brown fox jumps over the lazy dog " * 20], vocab_size=300, min_frequency=1
    )
    return PreTrainedTokenizerFast(tokenizer_object=trainer._tokenizer)


def test_deltas_concatenate_to_the_decoded_text(byte_level_tokenizer: Any) -> None:
    text = "the lazy fox said: déjà vu 😀 over the dog"
    ids = byte_level_tokenizer(text).input_ids
    detokenizer = IncrementalDetokenizer(byte_level_tokenizer)
    deltas = [detokenizer.push(token_id) for token_id in ids]
    assert "".join(deltas) + detokenizer.flush() == text
    # The emoji spans several byte tokens: none of the deltas holds half a character.
    assert all("\ufffd" not in delta for delta in deltas)
    assert "" in deltas  # the incomplete bytes were held back, then released whole


def test_flush_releases_an_incomplete_character(byte_level_tokenizer: Any) -> None:
    ids = byte_level_tokenizer("😀").input_ids
    assert len(ids) > 1
    detokenizer = IncrementalDetokenizer(byte_level_tokenizer)
    partial = "".join(detokenizer.push(token_id) for token_id in ids[:-1])
    assert partial == ""
    assert detokenizer.flush() != ""


def test_prompt_context_keeps_the_first_delta_right(byte_level_tokenizer: Any) -> None:
    prompt = byte_level_tokenizer("the quick").input_ids
    continuation = byte_level_tokenizer(" brown fox").input_ids
    detokenizer = IncrementalDetokenizer(byte_level_tokenizer, prompt)
    assert "".join(detokenizer.push(t) for t in continuation) == " brown fox"


def _tokens(*texts: str) -> list[PendingToken]:
    return [
        PendingToken(Token(text, "draft" if i % 2 else "target", i), i if i % 2 else None)
        for i, text in enumerate(texts)
    ]


def _texts(items: list[PendingToken]) -> list[str]:
    return [item.token.text for item in items]


def test_without_stop_strings_everything_is_released() -> None:
    stop_filter = StopStringFilter(())
    released, dropped = stop_filter.add(_tokens("a", "b"))
    assert _texts(released) == ["a", "b"] and dropped == []


def test_stop_string_across_tokens_cuts_and_drops() -> None:
    stop_filter = StopStringFilter(["END"])
    released, dropped = stop_filter.add(_tokens("hello E", "N", "Dx", "tail"))
    assert _texts(released) == ["hello "]  # the token holding "E" is cut before it
    assert _texts(dropped) == ["N", "Dx", "tail"]
    assert stop_filter.stopped
    assert stop_filter.add(_tokens("more")) == ([], _tokens("more"))


def test_possible_stop_prefix_is_held_until_resolved() -> None:
    stop_filter = StopStringFilter(["</answer>"])
    released, _ = stop_filter.add(_tokens("x = 1 <"))
    assert released == []  # "<" may begin "</answer>": the token waits
    released, _ = stop_filter.add(_tokens("/ans"))
    assert released == []  # "</ans" still may
    released, _ = stop_filter.add(_tokens("wer? no"))
    assert _texts(released) == ["x = 1 <", "/ans", "wer? no"]  # it did not
    assert not stop_filter.stopped


def test_held_text_is_released_exactly_once() -> None:
    stop_filter = StopStringFilter(["STOP"])
    out: list[str] = []
    for piece in ["ab S", "T", "x", "yz S"]:
        released, dropped = stop_filter.add(_tokens(piece))
        assert dropped == []
        out += _texts(released)
    out += _texts(stop_filter.flush())
    assert "".join(out) == "ab STxyz S"


def test_the_earliest_stop_string_wins() -> None:
    stop_filter = StopStringFilter(["bb", "a"])
    released, _ = stop_filter.add(_tokens("xxbb", "ya"))
    assert "".join(_texts(released)) == "xx"


def test_a_stop_string_at_the_start_releases_nothing() -> None:
    stop_filter = StopStringFilter(["##"])
    released, dropped = stop_filter.add(_tokens("##", "rest"))
    assert released == [] and _texts(dropped) == ["##", "rest"]


# ---- a generation's text: detokenizer and stop strings together --------------------------


def test_the_last_step_gives_the_held_back_bytes_to_the_last_token(
    byte_level_tokenizer: Any,
) -> None:
    ids = byte_level_tokenizer("the dog 😀").input_ids[:-1]  # ends inside the emoji
    output = OutputText(byte_level_tokenizer, (), ())
    first, dropped = output.add(ids[:3], 0, last=False)
    tokens, _ = output.add(ids[3:], 2, last=True)
    assert dropped == 0 and not output.stopped
    everything = first + tokens
    # Nothing lost: the text is the decoded ids, the incomplete character included.
    assert "".join(token.text for token in everything) == byte_level_tokenizer.decode(ids)
    assert tokens[-1].text.endswith("\ufffd")
    assert [token.id for token in everything] == ids
    assert [token.provenance for token in tokens] == ["draft", "draft"] + ["target"] * (
        len(tokens) - 2
    )


def test_a_stop_string_ends_the_text_and_counts_the_dropped_tokens(
    byte_level_tokenizer: Any,
) -> None:
    ids = byte_level_tokenizer("the quick brown fox jumps").input_ids
    output = OutputText(byte_level_tokenizer, (), ("brown",))
    tokens, dropped = output.add(ids, 0, last=True)
    assert output.stopped
    assert "".join(token.text for token in tokens) == "the quick "
    kept = len(tokens)
    assert dropped == len(ids) - kept
