"""Draft/target vocabularies compared from GGUF headers, as llama.cpp's rule decides."""

from __future__ import annotations

from pathlib import Path

import pytest

from gguf_headers import write_gguf_header
from speculative_llm.errors import VocabularyMismatchError
from speculative_llm.servers import gguf_vocab
from speculative_llm.servers.gguf_vocab import check_gguf_draft, read_gguf_vocabulary

TOKENS = [f"tok{i}" for i in range(300)]


def test_the_header_gives_the_tokenizer(tmp_path: Path) -> None:
    path = write_gguf_header(tmp_path / "m.gguf", TOKENS, model="gpt2", bos=1, eos=2)
    vocabulary = read_gguf_vocabulary(path)
    assert vocabulary is not None
    assert (vocabulary.model, vocabulary.tokens[:2], vocabulary.bos, vocabulary.eos) == (
        "gpt2",
        ("tok0", "tok1"),
        1,
        2,
    )


@pytest.mark.parametrize("content", [b"", b"root:x:0:0:", b"GGUF\x01\x00\x00\x00"])
def test_what_is_not_a_readable_gguf_is_left_to_llama_server(
    tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(content)
    assert read_gguf_vocabulary(path) is None
    assert read_gguf_vocabulary(tmp_path / "missing.gguf") is None


@pytest.mark.parametrize(
    ("draft", "reason"),
    [
        ({"model": "llama"}, "tokenizer 'llama' vs 'gpt2'"),
        ({"eos": 7}, "EOS token 7 vs 2"),
        ({"tokens": TOKENS + [f"x{i}" for i in range(129)]}, "429 vs 300 tokens"),
        ({"tokens": [*TOKENS[:10], "other", *TOKENS[11:]]}, "token 10 is 'other'"),
    ],
    ids=["tokenizer", "special-token", "size", "token-text"],
)
def test_incompatible_drafts_are_refused_naming_why(
    tmp_path: Path, draft: dict[str, object], reason: str
) -> None:
    target = write_gguf_header(tmp_path / "target.gguf", TOKENS)
    options: dict[str, object] = {"tokens": TOKENS, **draft}
    tokens = options.pop("tokens")
    path = write_gguf_header(tmp_path / "draft.gguf", tokens, **options)  # type: ignore[arg-type]
    with pytest.raises(VocabularyMismatchError, match="ngram-simple") as caught:
        check_gguf_draft(target, path)
    assert reason in str(caught.value) and caught.value.field == "draft_model"


def test_compatible_drafts_pass_as_in_llama_cpp(tmp_path: Path) -> None:
    target = write_gguf_header(tmp_path / "target.gguf", TOKENS)
    # A few extra tokens and different ids below 5 (control tokens) are accepted.
    draft_tokens = ["<a>", "<b>", *TOKENS[2:], *(f"extra{i}" for i in range(100))]
    check_gguf_draft(target, write_gguf_header(tmp_path / "draft.gguf", draft_tokens))


def test_the_verdict_is_cached_per_pair_of_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = write_gguf_header(tmp_path / "target.gguf", TOKENS)
    draft = write_gguf_header(tmp_path / "draft.gguf", TOKENS, model="llama")
    reads: list[Path] = []

    def counting(path: Path) -> object:
        reads.append(Path(path))
        return read_gguf_vocabulary(path)

    monkeypatch.setattr(gguf_vocab, "read_gguf_vocabulary", counting)
    for _ in range(3):
        with pytest.raises(VocabularyMismatchError):
            check_gguf_draft(target, draft)
    assert reads == [target, draft]  # read once, answered from the cache after
    write_gguf_header(draft, TOKENS)  # the file changed: decided again
    check_gguf_draft(target, draft)
    assert len(reads) == 4
