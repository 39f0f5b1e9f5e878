"""docs/contributing.md stays true: its runner and backend walk-throughs run as written.

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
    from speculative_llm.backends import registry
    from speculative_llm.backends.local import runner_registry

    for name, code in doc_files().items():
        (tmp_path / name).write_text(code, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry, "_REGISTERED", {})
    monkeypatch.setattr(runner_registry, "_registered", {})
    monkeypatch.setattr(runner_registry, "_loaded", {})
    modules = {path.stem for path in tmp_path.glob("*.py")}
    yield tmp_path
    for module in modules:
        sys.modules.pop(module, None)


def test_the_page_has_both_walkthroughs() -> None:
    assert {"next_letter.py", "use_next_letter.py", "reverse_backend.py"} <= set(doc_files())
    assert "use_reverse_backend.py" in doc_files()


def test_a_new_runner_is_one_module_and_one_registry_entry(walkthrough_dir: Path) -> None:
    pytest.importorskip("torch", reason="the local engine needs torch (extra 'local')")
    from speculative_llm import ConfigError
    from speculative_llm.backends.local.models import load_model

    runpy.run_path(str(walkthrough_dir / "use_next_letter.py"))
    with pytest.raises(ConfigError, match="option of the transformers runner") as caught:
        load_model("letters", runner="next-letter", fast_paths="off")
    assert caught.value.field == "fast_paths"
    with pytest.raises(ConfigError, match="Did you mean 'step'") as caught:
        load_model("letters", runner="next-letter", stpe=2)
    assert caught.value.field == "stpe"
    with pytest.raises(ConfigError, match="positive integer"):
        load_model("letters", runner="next-letter", step=0)


def test_a_new_backend_is_one_module_and_one_registry_entry(walkthrough_dir: Path) -> None:
    from speculative_llm import ConfigError, build_backend

    runpy.run_path(str(walkthrough_dir / "use_reverse_backend.py"))
    with pytest.raises(ConfigError, match="rejected its options") as caught:
        build_backend("reverse", model="m", options={"colour": "red"})
    assert caught.value.field == "colour"
