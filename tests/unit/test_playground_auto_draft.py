"""The draft model ``auto`` in the playground: offered first, picked per run, said why.

The models are header-only GGUFs (padded to stand for bigger files) in stores built by
``model_stores``; backends and servers are the scripted fakes. No model, no socket.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

gr = pytest.importorskip(
    "gradio", reason="the playground needs gradio: pip install speculative-llm[playground]"
)

from playground_fakes import Script, ScriptedBackend  # noqa: E402

from gguf_headers import write_gguf_header  # noqa: E402
from model_stores import add_hf_model, add_ollama_model, isolate_stores  # noqa: E402
from speculative_llm.engine.models import draft_choice  # noqa: E402
from speculative_llm.errors import ConfigError, VocabularyMismatchError  # noqa: E402
from speculative_playground import build_app  # noqa: E402
from speculative_playground.backend_pool import BackendPool  # noqa: E402
from speculative_playground.handlers import (  # noqa: E402
    Handlers,
    PlaygroundConfig,
    ResultViews,
    RunInputs,
)
from speculative_playground.security import SecurityPolicy  # noqa: E402
from speculative_playground.settings import (  # noqa: E402
    AUTO_DRAFT,
    RunSettings,
    model_choices,
)

TOKENS = [f"t{i}" for i in range(64)]
TARGET = "ollama:big:latest"
DRAFT = "hf:org/Small-GGUF"


@pytest.fixture
def stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, ...]:
    """A big target, a smaller model of its vocabulary, and a tiny one of another."""
    monkeypatch.setenv("SPECULATIVE_LLM_CACHE", str(tmp_path / "cache"))  # no packaged model
    roots = isolate_stores(monkeypatch, tmp_path / "stores")
    files = tmp_path / "files"
    add_ollama_model(
        roots["OLLAMA_MODELS"], "big", write_gguf_header(files / "big.gguf", TOKENS, padding=10_000)
    )
    add_ollama_model(
        roots["OLLAMA_MODELS"],
        "lonely",
        write_gguf_header(files / "lonely.gguf", ["u", *TOKENS[1:]]),
    )
    small = {"small.gguf": write_gguf_header(files / "small.gguf", TOKENS, padding=100)}
    add_hf_model(roots["HF_HUB_CACHE"], "org/Small-GGUF", small)
    return model_choices()


class _Factory:
    """Records the local engines the pool builds; each is a scripted backend."""

    def __init__(self) -> None:
        self.backends: list[ScriptedBackend] = []

    def __call__(self, name: str, **options: Any) -> ScriptedBackend:
        backend = ScriptedBackend(
            Script([[("a", "target")]]),
            Script([[("a", "draft")]]),
            methods=("none", "ngram", "draft_model"),
        )
        self.backends.append(backend)
        return backend


class _Server:
    """Stands in for servers.LlamaServer (records its options)."""

    def __init__(self, model: str, **options: Any) -> None:
        self.model, self.options = model, options

    def start(self) -> _Server:
        return self

    def stop(self) -> None:
        pass

    def backend(self) -> ScriptedBackend:
        return ScriptedBackend(Script([[("a", "target")]]), methods=("none", "server", "ngram"))


def _auto(backend: str = "local", model: str = TARGET) -> RunSettings:
    return RunSettings(
        backend=backend,  # type: ignore[arg-type]
        model=model,
        method="draft_model",
        draft_model=AUTO_DRAFT,
        timing="fair",
    )


def test_auto_is_the_first_draft_choice(stored: tuple[str, ...]) -> None:
    assert AUTO_DRAFT == draft_choice.AUTO_DRAFT  # the page's spelling is the core's
    app = build_app(pool=BackendPool(warm_up=False), models=list(stored))
    (draft,) = [
        b for b in app.blocks.values() if isinstance(b, gr.Dropdown) and b.label == "Draft model"
    ]
    assert [value for _, value in draft.choices][:2] == ["auto", ""]


def test_a_local_run_drafts_with_the_offered_model_auto_picks(stored: tuple[str, ...]) -> None:
    factory = _Factory()
    pool = BackendPool(backend_factory=factory, offered_models=stored, warm_up=False)
    with pool.lease(_auto()) as pair:
        assert pair.speculative_spec is not None
        assert pair.speculative_spec.draft_model == DRAFT == pair.draft_model
        assert pair.draft_note is not None
        assert pair.draft_note.startswith(f"Draft model: {DRAFT}, picked by auto: ")
        assert "passed over: ollama:lonely:latest: token 0 is 'u'" in pair.draft_note


def test_a_managed_server_starts_with_the_model_auto_picks(stored: tuple[str, ...]) -> None:
    servers: list[_Server] = []

    def start(model: str, **options: Any) -> _Server:
        servers.append(_Server(model, **options))
        return servers[-1]

    pool = BackendPool(server_factory=start, offered_models=stored, warm_up=False)
    with pool.lease(_auto("managed")) as pair:
        assert pair.draft_model == DRAFT
    (server,) = servers
    assert server.model == TARGET and server.options["draft_model"] == DRAFT
    assert server.options["spec_type"] == "draft-simple"


def test_auto_never_picks_a_model_the_page_does_not_offer(stored: tuple[str, ...]) -> None:
    offered = tuple(m for m in stored if m != DRAFT)
    pool = BackendPool(backend_factory=_Factory(), offered_models=offered, warm_up=False)
    with (
        pytest.raises(VocabularyMismatchError, match="no offered model") as caught,
        pool.lease(_auto()),
    ):
        pass
    assert DRAFT not in str(caught.value) and caught.value.field == "draft_model"


def test_auto_is_for_the_engines_the_page_starts() -> None:
    with pytest.raises(ConfigError, match="Managed llama-server") as caught:
        RunSettings(
            backend="url",
            server_url="http://127.0.0.1:8080",
            method="draft_model",
            draft_model=AUTO_DRAFT,
        )
    assert caught.value.field == "draft_model"


class _Request:
    session_hash = "tab-1"


def _compare(tmp_path: Path, pool: BackendPool, model: str) -> list[dict[str, Any]]:
    config = PlaygroundConfig(
        policy=SecurityPolicy(), pool=pool, update_interval_s=0.05, export_dir=tmp_path
    )
    handlers = Handlers(config, ResultViews(*(f"view-{n}" for n in range(13))))
    values: dict[str, Any] = {
        "prompt": "hello",
        "backend": "local",
        "model": model,
        "draft_model": AUTO_DRAFT,
        "method": "draft_model",
        "k": 4,
        "temperature": 0.0,
        "max_tokens": 8,
        "timing": "fair",
        "runs": 1,
        "server_kind": "llamacpp",
        "server_url": "",
        "baseline_url": "",
        "served_model": "",
        "api_key": "",
        "json_schema": "",
        "seed": 0,
        "exact": "distribution",
        "history": [],
    }
    return list(handlers.compare(_Request(), *[values[n] for n in RunInputs.names()]))  # type: ignore[arg-type]


def test_the_run_s_notes_and_history_name_the_picked_draft_and_why(
    stored: tuple[str, ...], tmp_path: Path
) -> None:
    pool = BackendPool(backend_factory=_Factory(), offered_models=stored, warm_up=False)
    last = _compare(tmp_path, pool, TARGET)[-1]
    assert f"Draft model: {DRAFT}, picked by auto: " in last["view-5"]  # the table's notes
    assert "is the smallest model on this machine" in last["view-5"]
    assert last["view-12"]["draft_model"] == DRAFT  # the record: what ran, not "auto"


def test_a_refusal_is_shown_as_a_clear_message(stored: tuple[str, ...], tmp_path: Path) -> None:
    pool = BackendPool(backend_factory=_Factory(), offered_models=stored, warm_up=False)
    last = _compare(tmp_path, pool, "ollama:lonely:latest")[-1]
    status = last["view-0"]
    assert "sp-status-error" in status and "Traceback" not in status
    assert "Draft model auto found no offered model that can draft for ollama:lonely" in status
    assert "Prompt lookup (n-gram), which needs none" in status
