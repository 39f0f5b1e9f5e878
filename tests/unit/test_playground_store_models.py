"""The playground offers the GGUF models of the user's own stores, after the packaged ones."""

from __future__ import annotations

from pathlib import Path

import pytest

gr = pytest.importorskip(
    "gradio", reason="the playground needs gradio: pip install speculative-llm[playground]"
)

from gguf_headers import write_gguf_header  # noqa: E402
from model_stores import add_hf_model, add_ollama_model, isolate_stores  # noqa: E402
from speculative_playground import build_app  # noqa: E402
from speculative_playground.backend_pool import BackendPool  # noqa: E402
from speculative_playground.settings import PACKAGED_MODELS, model_choices  # noqa: E402


@pytest.fixture
def stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, ...]:
    roots = isolate_stores(monkeypatch, tmp_path / "stores")
    header = write_gguf_header(tmp_path / "tiny.gguf", ["a", "b", "c"])
    add_ollama_model(roots["OLLAMA_MODELS"], "tiny", header, tag="q4")
    add_hf_model(roots["HF_HUB_CACHE"], "org/Tiny-GGUF", {"tiny.gguf": header})
    return ("ollama:tiny:q4", "hf:org/Tiny-GGUF")


def test_model_choices_are_the_packaged_models_then_the_stores(stored: tuple[str, ...]) -> None:
    assert model_choices() == (*PACKAGED_MODELS, *stored)
    assert model_choices("/m/a.gguf", "smollm2-135m") == ("/m/a.gguf", *PACKAGED_MODELS, *stored)


def test_the_page_offers_them_as_targets_and_drafts(stored: tuple[str, ...]) -> None:
    app = build_app(pool=BackendPool(warm_up=False))
    dropdowns = {b.label: b for b in app.blocks.values() if isinstance(b, gr.Dropdown)}
    target, draft = dropdowns["Target model"], dropdowns["Draft model"]
    assert [value for _, value in target.choices] == [*PACKAGED_MODELS, *stored]
    # Of unknown vocabulary to the page: offered, and checked by the engine when loaded.
    assert [value for _, value in draft.choices] == ["auto", "", *stored]


def test_the_playground_command_offers_them_after_the_operators_model(
    stored: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    from speculative_llm.cli import main
    from speculative_playground import backend_pool

    pools: list[BackendPool] = []

    class RecordingPool(backend_pool.BackendPool):
        def __init__(self, **options: object) -> None:
            super().__init__(**options)  # type: ignore[arg-type]
            pools.append(self)

    monkeypatch.setattr(backend_pool, "BackendPool", RecordingPool)
    monkeypatch.setattr("speculative_playground.app.launch", lambda app, **options: None)
    assert main(["playground", "--no-browser", "--model", "/m/a.gguf"]) == 0
    (pool,) = pools
    assert pool.offered_models == ("/m/a.gguf", *PACKAGED_MODELS, *stored)
