"""CountedPatches: a change shared by concurrent blocks is applied once, undone once."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from speculative_llm.engine.runners.transformers.fast_paths import CountedPatches, Undo


@dataclass
class Switch:
    name: str
    value: str = "original"
    applied: int = 0
    undone: int = 0


def _set_fast(switch: Switch) -> Undo:
    previous = switch.value
    switch.value = "fast"
    switch.applied += 1

    def undo() -> None:
        switch.value = previous
        switch.undone += 1

    return undo


def test_nested_blocks_apply_once_and_the_last_one_undoes() -> None:
    patches: CountedPatches[Switch] = CountedPatches()
    a, b = Switch("a"), Switch("b")
    with patches.applied([a, b], _set_fast):
        assert (a.value, b.value) == ("fast", "fast")
        with patches.applied([b], _set_fast):
            assert patches.users(b) == 2 and patches.users(a) == 1
        assert b.value == "fast"  # the outer block still holds it
        assert b.applied == 1 and b.undone == 0
    assert (a.value, b.value) == ("original", "original")
    assert (a.applied, a.undone, b.applied, b.undone) == (1, 1, 1, 1)
    assert patches.users(a) == patches.users(b) == 0


def test_an_error_in_the_block_still_undoes() -> None:
    patches: CountedPatches[Switch] = CountedPatches()
    target = Switch("t")
    with pytest.raises(KeyError), patches.applied([target], _set_fast):
        raise KeyError("mid-pass")
    assert target.value == "original" and patches.users(target) == 0


def test_a_failing_apply_undoes_what_this_block_changed_and_keeps_other_holds() -> None:
    patches: CountedPatches[Switch] = CountedPatches()
    held_elsewhere, fresh, broken = Switch("held"), Switch("fresh"), Switch("broken")

    def apply(switch: Switch) -> Undo:
        if switch is broken:
            raise MemoryError("cannot pack")
        return _set_fast(switch)

    with patches.applied([held_elsewhere], apply):
        with pytest.raises(MemoryError), patches.applied([held_elsewhere, fresh, broken], apply):
            pass
        assert fresh.value == "original" and fresh.undone == 1
        assert held_elsewhere.value == "fast"  # still held by the outer block
        assert patches.users(held_elsewhere) == 1 and patches.users(fresh) == 0
    assert held_elsewhere.value == "original"


def test_concurrent_blocks_leave_every_target_as_it_was() -> None:
    patches: CountedPatches[Switch] = CountedPatches()
    shared = Switch("shared")
    seen_inside: list[str] = []
    start = threading.Barrier(4)

    def worker() -> None:
        start.wait()
        for _ in range(200):
            with patches.applied([shared], _set_fast):
                seen_inside.append(shared.value)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(seen_inside) == {"fast"} and len(seen_inside) == 800
    assert shared.value == "original" and shared.applied == shared.undone >= 1
    assert patches.users(shared) == 0
