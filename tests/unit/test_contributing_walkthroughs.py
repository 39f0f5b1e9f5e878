"""docs/contributing.md stays true: its runner, drafter, engine and backend walk-throughs run.

Each ``python title="file.py"`` block of the page is written to that file, the modules
are importable from there, and the ``use_*.py`` blocks run (their asserts are the test).
"""

from __future__ import annotations

import re
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "contributing.md"
_BLOCK = re.compile(r'^```python title="([\w.]+)"\n(.*?)^```$', re.DOTALL | re.MULTILINE)


def doc_files() -> dict[str, str]:
    """File name -> code of every titled Python block in docs/contributing.md."""
    return dict(_BLOCK.findall(DOC.read_text(encoding="utf-8")))


@pytest.fixture
def walkthrough_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The page's files in a directory on sys.path, with registries left as they were."""
    from speculative_llm import drafter_registry
    from speculative_llm.backends import registry
    from speculative_llm.engine.runners import registry as runner_registry

    for name, code in doc_files().items():
        (tmp_path / name).write_text(code, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry, "_REGISTERED", {})
    monkeypatch.setattr(runner_registry, "_registered", {})
    monkeypatch.setattr(runner_registry, "_loaded", {})
    monkeypatch.setattr(drafter_registry, "_registered", {})
    monkeypatch.setattr(drafter_registry, "_factories", {})
    modules = {path.stem for path in tmp_path.glob("*.py")}
    yield tmp_path
    for module in modules:
        sys.modules.pop(module, None)


def test_the_page_has_every_walkthrough() -> None:
    assert {"next_letter.py", "use_next_letter.py", "reverse_backend.py"} <= set(doc_files())
    assert {"use_reverse_backend.py", "tally_dialect.py", "use_tally.py"} <= set(doc_files())
    assert {"alphabet_drafter.py", "use_alphabet_drafter.py"} <= set(doc_files())


def test_a_new_runner_is_one_module_and_one_registry_entry(walkthrough_dir: Path) -> None:
    pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
    from speculative_llm import ConfigError
    from speculative_llm.engine.models.loading import load_model

    runpy.run_path(str(walkthrough_dir / "use_next_letter.py"))
    with pytest.raises(ConfigError, match="option of the transformers runner") as caught:
        load_model("letters", runner="next-letter", fast_paths="off")
    assert caught.value.field == "fast_paths"
    with pytest.raises(ConfigError, match="Did you mean 'step'") as caught:
        load_model("letters", runner="next-letter", stpe=2)
    assert caught.value.field == "stpe"
    with pytest.raises(ConfigError, match="positive integer"):
        load_model("letters", runner="next-letter", step=0)


def test_a_new_drafter_is_one_module_and_one_registry_entry(walkthrough_dir: Path) -> None:
    pytest.importorskip("torch", reason="tiny models need torch (extra 'transformers')")
    import argparse

    from speculative_llm import ConfigError, SpecConfig
    from speculative_llm.commands import generate

    runpy.run_path(str(walkthrough_dir / "use_alphabet_drafter.py"))
    # The command line offers it and builds its configuration...
    parser = argparse.ArgumentParser()
    generate.add_arguments(parser)
    args = parser.parse_args(["--method", "alphabet", "hello"])
    assert generate.build_spec(args).method == "alphabet"
    # ...and a method nobody registered is refused with the registered ones named.
    with pytest.raises(ConfigError, match="alphabet") as caught:
        SpecConfig(method="alphabett")
    assert caught.value.field == "method"


def test_a_new_backend_is_one_module_and_one_registry_entry(walkthrough_dir: Path) -> None:
    from speculative_llm import ConfigError, build_backend

    runpy.run_path(str(walkthrough_dir / "use_reverse_backend.py"))
    with pytest.raises(ConfigError, match="rejected its options") as caught:
        build_backend("reverse", model="m", options={"colour": "red"})
    assert caught.value.field == "colour"


def test_a_new_server_engine_is_one_dialect_module_and_one_registry_entry(
    walkthrough_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from speculative_llm import ConfigError, SpecConfig, build_backend
    from speculative_llm.backends import registry
    from speculative_llm.backends.catalog import BackendEntry
    from speculative_llm.backends.openai_compat import OpenAICompatibleBackend

    runpy.run_path(str(walkthrough_dir / "use_tally.py"))
    # As a built-in: one BackendEntry, and the builder treats it as the server it is.
    entry = BackendEntry("tally", "tally_dialect:TallyBackend", label="Tally", server=True)
    monkeypatch.setattr(registry, "_REGISTERED", {})
    monkeypatch.setattr(registry, "_BUILTIN", {**registry._BUILTIN, "tally": entry})
    with pytest.raises(ConfigError, match="give base_url") as caught:
        build_backend("tally")
    assert caught.value.field == "base_url"
    with build_backend("tally", base_url="http://127.0.0.1:9").backend as backend:
        assert isinstance(backend, OpenAICompatibleBackend) and backend.name == "tally"
        assert backend.hints.engine == "Tally"  # the dialect's, given to its class
    # What every engine shares: a speculation it cannot confirm is refused by name...
    with pytest.raises(ConfigError, match="cannot tell whether Tally speculates") as caught:
        build_backend("tally", base_url="http://127.0.0.1:9", options={"require_speculation": True})
    assert caught.value.field == "require_speculation"
    # ...and so is a method the server cannot switch per request.
    with pytest.raises(ConfigError, match="does not support speculative method"):
        build_backend("tally", base_url="http://127.0.0.1:9", speculative=SpecConfig.baseline())
