"""What the transport hands back: a parsed JSON answer, or an auxiliary GET's outcome (pure).

``JSONResponse`` is the answer of a request (``HTTPTransport.request_json``);
``FetchResult`` is that of an auxiliary GET (``/metrics``, ``/slots``...), which never
raises: a failure is part of the result, for the backend to judge.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from speculative_llm.backends.http.errors import decode_json_object

__all__ = ["FetchResult", "JSONResponse", "json_response"]


@dataclass(frozen=True, slots=True)
class JSONResponse:
    """A parsed JSON response with its headers."""

    data: dict[str, Any]
    headers: Mapping[str, str]
    status_code: int = 200


@dataclass(frozen=True, slots=True)
class FetchResult:
    """Outcome of an auxiliary GET (``/metrics``, ``/props``...): text, or why there is none."""

    path: str
    status_code: int | None = None
    text: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the GET succeeded with a 2xx status."""
        return (
            self.text is not None
            and self.status_code is not None
            and (200 <= self.status_code < 300)
        )

    def json_object(self) -> dict[str, Any] | None:
        """The body as a JSON object, or None when it is not one."""
        if not self.ok or self.text is None:
            return None
        try:
            payload = json.loads(self.text)
        except (ValueError, RecursionError):
            return None
        return payload if isinstance(payload, dict) else None


def json_response(response: httpx.Response, content: bytes, url: str) -> JSONResponse:
    """The ``JSONResponse`` of ``response`` whose body is ``content``.

    Raises:
        MalformedResponseError: The body is not a JSON object.
    """
    return JSONResponse(
        decode_json_object(content, url=url), dict(response.headers), response.status_code
    )
