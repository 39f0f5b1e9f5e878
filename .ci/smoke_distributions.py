"""Smoke test of the three installed wheels: a LangChain chain and a LlamaIndex call.

Run by .ci/build-distributions.sh with the python of a fresh virtual environment that
holds the wheels of speculative-llm (no extras), langchain-speculative and
llama-index-llms-speculative, and nothing from the checkout. Both adapters talk to a tiny
OpenAI-compatible server started here (127.0.0.1, a free port) through the ``openai``
backend; each answer must carry its ``SpecStats``.
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ANSWER = "Draft, then verify."
COMPLETION_TOKENS = 5


class _OpenAIHandler(BaseHTTPRequestHandler):
    """Answers /v1/models, /v1/chat/completions and /v1/completions with a fixed text."""

    def log_message(self, format: str, *args: Any) -> None:
        """Keep CI's log to the smoke test's own lines."""

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        """The model list."""
        if self.path.rstrip("/") == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "smoke", "object": "model"}]})
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        """One chat or text completion, never streamed (the adapters are asked for none)."""
        length = int(self.headers.get("Content-Length") or 0)
        request = json.loads(self.rfile.read(length) or b"{}")
        usage = {
            "prompt_tokens": 7,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": 7 + COMPLETION_TOKENS,
        }
        if request.get("stream"):
            self._send(400, {"error": {"message": "the smoke server does not stream"}})
        elif self.path == "/v1/chat/completions":
            message = {"role": "assistant", "content": ANSWER}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            self._send(200, {"id": "c1", "object": "chat.completion", "model": "smoke",
                             "choices": [choice], "usage": usage})  # fmt: skip
        elif self.path == "/v1/completions":
            choice = {"index": 0, "text": ANSWER, "finish_reason": "stop"}
            self._send(200, {"id": "c2", "object": "text_completion", "model": "smoke",
                             "choices": [choice], "usage": usage})  # fmt: skip
        else:
            self._send(404, {"error": {"message": f"no route {self.path}"}})


def _check_installed_not_checkout() -> None:
    import langchain_speculative
    import llama_index.llms.speculative
    import speculative_llm

    checkout = Path(__file__).resolve().parents[1]
    for module in (speculative_llm, langchain_speculative, llama_index.llms.speculative):
        path = Path(module.__file__ or "").resolve()
        assert checkout not in path.parents, f"{module.__name__} imported from the checkout"
        print(f"  {module.__name__}: {path.parent}")


def _langchain_chain(base_url: str) -> None:
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate

    from langchain_speculative import ChatSpeculative, get_spec_stats_callback

    model = ChatSpeculative(backend="openai", base_url=base_url, model="smoke", max_tokens=16)
    chain = ChatPromptTemplate.from_template("Say {what}.") | model | StrOutputParser()
    with get_spec_stats_callback() as spec:
        text = chain.invoke({"what": "how speculative decoding works"})
    assert text == ANSWER, text
    assert spec.calls == 1 and len(spec.records) == 1, spec
    stats = spec.records[0].stats
    assert stats.backend == "openai" and stats.generated_tokens == COMPLETION_TOKENS, stats
    print(f"  LangChain: {text!r}, SpecStats(backend={stats.backend!r}, source={stats.source!r})")


def _llama_index_complete(base_url: str) -> None:
    from llama_index.llms.speculative import Speculative, spec_stats_from_response

    llm = Speculative(backend="openai", base_url=base_url, model="smoke", max_tokens=16)
    response = llm.complete("Say how speculative decoding works.")
    assert response.text == ANSWER, response.text
    stats = spec_stats_from_response(response)
    assert stats is not None, response.additional_kwargs
    assert stats.backend == "openai" and stats.generated_tokens == COMPLETION_TOKENS, stats
    print(f"  LlamaIndex: {response.text!r}, SpecStats(source={stats.source!r})")


def main() -> int:
    """Start the server, run both adapters against it, stop it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OpenAIHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        _check_installed_not_checkout()
        _langchain_chain(base_url)
        _llama_index_complete(base_url)
    finally:
        server.shutdown()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
