"""Packaged models fetched without pip: straight from the index over HTTPS, checked.

The index is faked with ``httpx.MockTransport`` (unit tests have no sockets).
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from speculative_llm.engine.models import wheels
from speculative_llm.engine.models.sources import (
    PACKAGED_MODELS,
    PackagedModel,
    packaged_model_path,
)
from speculative_llm.errors import ModelNotFoundError

PART = b"GGUF" + bytes(range(256)) * 8
WHEEL_NAME = "test_model_part1-1.0.0-py3-none-any.whl"


def _wheel() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("test_model_part1/data/test-model.gguf.part00", PART)
    return buffer.getvalue()


WHEEL = _wheel()
SHA256 = hashlib.sha256(WHEEL).hexdigest()


@pytest.fixture(autouse=True)
def no_pip(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("PIP_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(wheels, "_pip_available", lambda: False)
    monkeypatch.setitem(
        PACKAGED_MODELS,
        "test-model",
        PackagedModel(
            alias="test-model",
            description="a test model",
            filename="test-model.gguf",
            packages=("test-model-part1==1.0.0",),
            members=("test-model.gguf.part00",),
            size=len(PART),
            sha256=hashlib.sha256(PART).hexdigest(),
            chat=False,
        ),
    )


def _serve(
    monkeypatch: pytest.MonkeyPatch, pages: dict[str, Callable[[httpx.Request], httpx.Response]]
) -> list[str]:
    """Answer the URLs in ``pages`` (404 for any other); returns the URLs asked for."""
    asked: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        page = pages.get(str(request.url))
        return page(request) if page else httpx.Response(404, text="not found")

    monkeypatch.setattr(
        wheels, "_client", lambda: httpx.Client(transport=httpx.MockTransport(handle))
    )
    return asked


def _pypi_json(sha256: str = SHA256) -> Callable[[httpx.Request], httpx.Response]:
    # What else a release may hold: an sdist and a platform wheel (never fetched here).
    others = ["test_model_part1-1.0.0.tar.gz", "test_model_part1-1.0.0-cp311-cp311-linux.whl"]
    files = [
        *(
            {"filename": name, "url": f"https://files.test/{name}", "digests": {"sha256": "0" * 64}}
            for name in others
        ),
        {
            "filename": WHEEL_NAME,
            "url": f"https://files.test/{WHEEL_NAME}",
            "digests": {"sha256": sha256},
        },
    ]
    return lambda request: httpx.Response(200, json={"urls": files})


def _wheel_file(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, content=WHEEL)


def _simple_json(files: list[dict[str, object]]) -> Callable[[httpx.Request], httpx.Response]:
    return lambda request: httpx.Response(
        200,
        content=json.dumps({"files": files}),
        headers={"content-type": "application/vnd.pypi.simple.v1+json"},
    )


SIMPLE = "https://pypi.org/simple/test-model-part1/"
JSON_API = "https://pypi.org/pypi/test-model-part1/1.0.0/json"


def test_without_pip_the_wheel_comes_from_pypis_simple_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = {"filename": WHEEL_NAME, "url": f"https://files.test/{WHEEL_NAME}"}
    asked = _serve(
        monkeypatch,
        {
            SIMPLE: _simple_json([{**wheel, "hashes": {"sha256": SHA256}}]),
            f"https://files.test/{WHEEL_NAME}": _wheel_file,
        },
    )
    path = packaged_model_path("test-model", cache_dir=tmp_path, progress=False)
    assert path.read_bytes() == PART
    assert asked == [SIMPLE, f"https://files.test/{WHEEL_NAME}"]


def test_then_from_pypis_json_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _serve(
        monkeypatch, {JSON_API: _pypi_json(), f"https://files.test/{WHEEL_NAME}": _wheel_file}
    )
    path = packaged_model_path("test-model", cache_dir=tmp_path, progress=False)
    assert path.read_bytes() == PART
    assert asked == [SIMPLE, JSON_API, f"https://files.test/{WHEEL_NAME}"]


def test_a_wheel_with_another_checksum_is_refused_and_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _serve(
        monkeypatch,
        {
            JSON_API: _pypi_json("1" * 64),
            f"https://files.test/{WHEEL_NAME}": _wheel_file,
        },
    )
    with pytest.raises(ModelNotFoundError, match=f"has sha256 {SHA256}, the index says 1111"):
        wheels.download_wheel("test-model-part1==1.0.0", tmp_path, progress=False)
    assert not list(tmp_path.iterdir())


def test_the_error_says_pip_is_missing_and_what_was_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _serve(monkeypatch, {})
    with pytest.raises(ModelNotFoundError) as caught:
        packaged_model_path("test-model", cache_dir=tmp_path, progress=False)
    message = str(caught.value)
    assert "pip is not installed here" in message
    assert (
        "from the simple index https://pypi.org/simple/: HTTPStatusError: Client error '404"
        in message
    )
    assert f"then from {JSON_API}: HTTPStatusError" in message
    assert "PIP_INDEX_URL" in message and caught.value.field == "model"


def test_a_configured_simple_index_is_used_in_json_or_html(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UV_INDEX_URL", "https://user:secret@index.test/simple")
    project = "https://user:secret@index.test/simple/test-model-part1/"
    older = "test_model_part1-0.9.0-py3-none-any.whl"
    as_json = {
        "files": [
            {"filename": older, "url": f"../../files/{older}", "hashes": {"sha256": "0" * 64}},
            {
                "filename": WHEEL_NAME,
                "url": f"../../files/{WHEEL_NAME}",
                "hashes": {"sha256": SHA256},
            },
        ]
    }
    wheel_url = f"https://user:secret@index.test/files/{WHEEL_NAME}"
    asked = _serve(
        monkeypatch,
        {
            project: lambda request: httpx.Response(
                200,
                content=json.dumps(as_json),
                headers={"content-type": "application/vnd.pypi.simple.v1+json"},
            ),
            wheel_url: _wheel_file,
        },
    )
    assert wheels.download_wheel("test-model-part1==1.0.0", tmp_path, False).read_bytes() == WHEEL
    assert asked == [project, wheel_url]
    page = f'<a href="../../files/{WHEEL_NAME}#sha256={SHA256}">{WHEEL_NAME}</a>'
    _serve(
        monkeypatch,
        {project: lambda request: httpx.Response(200, text=page), wheel_url: _wheel_file},
    )
    (tmp_path / "html").mkdir()
    assert wheels.download_wheel("test-model-part1==1.0.0", tmp_path / "html", False).is_file()


def test_credentials_of_the_index_never_show_in_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_INDEX_URL", "https://user:secret@index.test/simple")
    _serve(monkeypatch, {})
    with pytest.raises(
        ModelNotFoundError, match=r"the simple index https://\*\*\*@index"
    ) as caught:
        wheels.download_wheel("test-model-part1==1.0.0", tmp_path, progress=False)
    assert "secret" not in str(caught.value)


def test_with_pip_importable_pip_downloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wheels, "_pip_available", lambda: True)
    calls: list[str] = []
    monkeypatch.setattr(
        wheels, "_pip_download", lambda requirement, *_: calls.append(requirement) or tmp_path
    )
    _serve(monkeypatch, {})
    assert wheels.download_wheel("test-model-part1==1.0.0", tmp_path, False) == tmp_path
    assert calls == ["test-model-part1==1.0.0"]
