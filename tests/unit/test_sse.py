"""The incremental SSE parser: line endings, comments, multi-line data, [DONE], splits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from fakeserver import fixture_bytes
from speculative_llm.backends.http.sse import SSEEvent, SSEParser, aiter_sse_events, iter_sse_events


def parse_all(*pieces: bytes) -> list[SSEEvent]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    for piece in pieces:
        events.extend(parser.feed(piece))
    events.extend(parser.close())
    return events


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending_dispatches_the_same_events(newline: bytes) -> None:
    body = newline.join([b"data: one", b"", b"data: two", b"", b""])
    assert [e.data for e in parse_all(body)] == ["one", "two"]


def test_crlf_split_between_pieces_does_not_create_an_empty_event_or_line() -> None:
    events = parse_all(b"data: a\r", b"\n\r", b"\ndata: b\r\n\r\n")
    assert [e.data for e in events] == ["a", "b"]


def test_comments_and_pings_are_ignored() -> None:
    events = parse_all(b":\n\n: keep-alive\ndata: x\n\n:\n\n")
    assert [e.data for e in events] == ["x"]


def test_multi_line_data_is_joined_with_newlines() -> None:
    events = parse_all(b"data: first\ndata:second\ndata:  third\n\n")
    assert events[0].data == "first\nsecond\n third"


def test_space_after_colon_is_optional_and_only_one_is_removed() -> None:
    assert parse_all(b'data:{"a":1}\n\n')[0].data == '{"a":1}'
    assert parse_all(b"data:  x\n\n")[0].data == " x"


def test_event_type_id_and_retry_fields() -> None:
    event = parse_all(b"event: error\nid: 7\nretry: 1500\ndata: boom\n\n")[0]
    assert (event.event, event.id, event.retry, event.data) == ("error", "7", 1500, "boom")


def test_done_marker() -> None:
    events = parse_all(b"data: {}\n\ndata: [DONE]\n\n")
    assert [e.is_done for e in events] == [False, True]


def test_event_without_data_is_not_dispatched() -> None:
    assert parse_all(b"event: ping\n\nid: 3\n\n") == []


def test_unterminated_last_event_is_discarded_and_reported() -> None:
    parser = SSEParser()
    assert [e.data for e in parser.feed(b"data: a\n\ndata: b")] == ["a"]
    assert parser.close() == []
    assert parser.has_partial_event


def test_utf8_split_inside_a_character_is_decoded_whole() -> None:
    text = "data: héllo ✓\n\n".encode()
    cut = text.index("✓".encode()) + 1
    events = parse_all(text[:cut], text[cut:])
    assert events[0].data == "héllo ✓"


def test_byte_order_mark_at_the_start_is_skipped() -> None:
    assert parse_all(b"\xef\xbb\xbfdata: x\n\n")[0].data == "x"


def test_oversized_event_raises_instead_of_growing_forever() -> None:
    parser = SSEParser(max_event_bytes=64)
    with pytest.raises(ValueError, match="exceeded 64 bytes"):
        parser.feed(b"data: " + b"x" * 100)


@pytest.mark.parametrize(
    "relative",
    ["openai/chat_stream.sse", "tgi/generate_stream.sse", "sglang/generate_stream.sse"],
)
def test_byte_by_byte_feeding_matches_whole_feeding(relative: str) -> None:
    body = fixture_bytes(relative)
    whole = parse_all(body)
    one_by_one = parse_all(*(body[i : i + 1] for i in range(len(body))))
    assert whole == one_by_one
    assert len(whole) >= 3


def test_iter_helpers_agree() -> None:
    body = fixture_bytes("openai/chat_stream.sse")
    pieces = [body[i : i + 7] for i in range(0, len(body), 7)]

    async def gather() -> list[SSEEvent]:
        async def source() -> AsyncIterator[bytes]:
            for piece in pieces:
                yield piece

        return [event async for event in aiter_sse_events(source())]

    assert list(iter_sse_events(pieces)) == asyncio.run(gather())
