"""Client overhead over raw httpx, and llama-server speedups through our API, in one run.

Two measurements against real llama-servers started here:

* **Client overhead**: the same chat requests sent to the same llama-server by a raw
  ``httpx`` call (the exact body our backend sends, the JSON parsed, nothing else) and by
  ``LlamaCppBackend`` (body building, parsing, statistics, provenance), interleaved
  pair by pair with alternating order so drift in the server's speed cancels out.
  Reported: the median per-request difference and the ratio of total times, for
  ``generate`` and for ``stream`` (raw: read the SSE lines to ``[DONE]``). Goal: < 2 %.
* **Speedups**: llama-server with n-gram drafting and with a draft model against the
  same build and model without speculation, through our API, the variants interleaved
  per prompt. Reported: decode tokens/s (from the server's own timings), the ratio to
  the baseline, acceptance figures, and whether the greedy text matched the baseline.

Run::

    python -m speculative_llm.bench.client_overhead --rounds 5 --max-tokens 128

or call ``measure_client_overhead`` / ``measure_speedups`` / ``run_client_overhead_bench``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from speculative_llm.backends.engines.llamacpp import LlamaCppBackend
from speculative_llm.bench.prompts import BenchPrompt, builtin_prompts
from speculative_llm.config import SpecConfig
from speculative_llm.errors import ConfigError
from speculative_llm.servers import LlamaServer, format_command
from speculative_llm.types import Completion, GenerationRequest

__all__ = [
    "OverheadResult",
    "SpeedupResult",
    "bench_requests",
    "main",
    "measure_client_overhead",
    "measure_speedups",
    "run_client_overhead_bench",
]

CHAT_PATH = "/v1/chat/completions"


DEFAULT_NGRAM_DRAFT_MAX: tuple[int, ...] = (SpecConfig().fixed_draft_length,)
"""Draft lengths of the ngram-simple servers compared (``--spec-ngram-simple-size-m``)."""


@dataclass(frozen=True, slots=True)
class OverheadResult:
    """Our client against a raw httpx call, same requests, interleaved.

    Attributes:
        mode: ``generate`` or ``stream``.
        pairs: Timed request pairs.
        raw_s: Seconds per raw httpx request.
        client_s: Seconds per ``LlamaCppBackend`` request.
        same_tokens: Pairs whose completion lengths matched (same work done).
        raw_cpu_s: CPU seconds this process spent per raw request.
        client_cpu_s: CPU seconds this process spent per ``LlamaCppBackend`` request.
            The difference is the client's own work, unaffected by the server's
            timing noise, which dominates wall-clock differences on a shared machine.
    """

    mode: str
    pairs: int
    raw_s: tuple[float, ...]
    client_s: tuple[float, ...]
    same_tokens: int
    raw_cpu_s: tuple[float, ...] = ()
    client_cpu_s: tuple[float, ...] = ()

    @property
    def median_cpu_overhead_ms(self) -> float | None:
        """Median extra CPU milliseconds of our client per request (None: not measured)."""
        if not self.raw_cpu_s or not self.client_cpu_s:
            return None
        return 1000.0 * (statistics.median(self.client_cpu_s) - statistics.median(self.raw_cpu_s))

    @property
    def median_raw_s(self) -> float:
        """Median seconds of a raw request."""
        return statistics.median(self.raw_s)

    @property
    def median_overhead_ms(self) -> float:
        """Median of the per-pair differences (client - raw), in milliseconds."""
        return 1000.0 * statistics.median(
            c - r for c, r in zip(self.client_s, self.raw_s, strict=True)
        )

    @property
    def overhead_ratio(self) -> float:
        """Total client time / total raw time - 1 (0.01 is 1 %)."""
        return sum(self.client_s) / sum(self.raw_s) - 1.0

    @property
    def median_overhead_ratio(self) -> float:
        """Median per-pair difference relative to the median raw request time."""
        return self.median_overhead_ms / 1000.0 / self.median_raw_s

    def to_dict(self) -> dict[str, Any]:
        """Figures as JSON-compatible values."""
        return {
            **asdict(self),
            "median_raw_s": self.median_raw_s,
            "median_overhead_ms": self.median_overhead_ms,
            "overhead_ratio": self.overhead_ratio,
            "median_overhead_ratio": self.median_overhead_ratio,
            "median_cpu_overhead_ms": self.median_cpu_overhead_ms,
        }


@dataclass(slots=True)
class SpeedupResult:
    """One llama-server configuration through our API, against the baseline server.

    Attributes:
        name: ``baseline``, ``ngram`` or ``draft``.
        spec_type: llama-server ``--spec-type`` (None for the baseline).
        generated_tokens: Tokens generated over all requests.
        decode_s: Server-reported decode seconds (``timings.predicted_ms``) summed.
        request_s: Client-measured request seconds summed.
        draft_tokens: Draft tokens proposed (exact, from ``timings``).
        accepted_tokens: Draft tokens accepted.
        verify_steps: Target passes while decoding.
        matches_baseline: Requests whose greedy text equalled the baseline's.
        requests: Requests made.
    """

    name: str
    spec_type: str | None
    generated_tokens: int = 0
    decode_s: float = 0.0
    request_s: float = 0.0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0
    matches_baseline: int = 0
    requests: int = 0
    speedup: float | None = None
    end_to_end_speedup: float | None = None
    texts: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def decode_tokens_per_second(self) -> float:
        """Generated tokens / server decode seconds."""
        return self.generated_tokens / self.decode_s if self.decode_s else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Generated tokens per target pass (``SpecStats.mean_accepted_length``, pooled)."""
        return self.generated_tokens / self.verify_steps if self.verify_steps else None

    def add(self, prompt_id: str, completion: Completion, request_s: float) -> None:
        """Add one request's figures."""
        stats = completion.stats
        self.requests += 1
        self.request_s += request_s
        self.generated_tokens += stats.generated_tokens or 0
        self.decode_s += stats.decode_s or 0.0
        self.draft_tokens += stats.draft_tokens or 0
        self.accepted_tokens += stats.accepted_tokens or 0
        self.verify_steps += stats.verify_steps or 0
        self.texts.setdefault(prompt_id, completion.text)

    def to_dict(self) -> dict[str, Any]:
        """Figures as JSON-compatible values (texts left out)."""
        return {
            "name": self.name,
            "spec_type": self.spec_type,
            "requests": self.requests,
            "generated_tokens": self.generated_tokens,
            "decode_s": self.decode_s,
            "request_s": self.request_s,
            "decode_tokens_per_second": self.decode_tokens_per_second,
            "speedup": self.speedup,
            "end_to_end_speedup": self.end_to_end_speedup,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_length": self.mean_accepted_length,
            "matches_baseline": self.matches_baseline,
        }


NO_PROMPT_CACHE = {"cache_prompt": False}
"""llama-server's prompt cache changes greedy text when a prompt is sent twice; every
request here is sent several times, so the cache is off for all of them."""


def bench_requests(
    *,
    per_category: int = 2,
    max_tokens: int = 128,
    categories: Sequence[str] = ("code_edit", "rag", "qa"),
) -> list[tuple[str, GenerationRequest]]:
    """Greedy chat requests from the built-in benchmark prompts (``(id, request)`` pairs)."""
    chosen: list[BenchPrompt] = []
    for category in categories:
        chosen += [p for p in builtin_prompts([category]) if p.messages is not None][:per_category]
    return [(p.id, p.request(max_tokens, None).replace(extra=NO_PROMPT_CACHE)) for p in chosen]


def _raw_generate(client: httpx.Client, url: str, body: Mapping[str, Any]) -> int:
    response = client.post(url, json=body)
    response.raise_for_status()
    usage = response.json().get("usage") or {}
    return int(usage.get("completion_tokens") or 0)


def _raw_stream(client: httpx.Client, url: str, body: Mapping[str, Any]) -> int:
    completion_tokens = 0
    with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                break
            usage = json.loads(data).get("usage")
            if usage:
                completion_tokens = int(usage.get("completion_tokens") or 0)
    return completion_tokens


def _client_generate(backend: LlamaCppBackend, request: GenerationRequest) -> int:
    return backend.generate(request).stats.generated_tokens or 0


def _client_stream(backend: LlamaCppBackend, request: GenerationRequest) -> int:
    chunks = list(backend.stream(request))
    stats = chunks[-1].stats if chunks else None
    return (stats.generated_tokens or 0) if stats is not None else 0


def measure_client_overhead(
    base_url: str,
    requests: Sequence[tuple[str, GenerationRequest]],
    *,
    rounds: int = 5,
    mode: str = "generate",
    warmup: int = 1,
) -> OverheadResult:
    """Time our client against a raw httpx call on the same server and requests.

    Both sides send the same body (``LlamaCppBackend.build_body``) over a kept-alive
    connection; pairs alternate which side goes first.

    Raises:
        ConfigError: ``mode`` is not ``generate`` or ``stream``, or ``rounds`` < 1.
    """
    if mode not in ("generate", "stream"):
        raise ConfigError(f"mode must be 'generate' or 'stream', got {mode!r}.", field="mode")
    if rounds < 1:
        raise ConfigError(f"rounds must be >= 1, got {rounds}.", field="rounds")
    stream = mode == "stream"
    raw_call = _raw_stream if stream else _raw_generate
    client_call = _client_stream if stream else _client_generate
    raw_s: list[float] = []
    client_s: list[float] = []
    cpu_s: dict[str, list[float]] = {"raw": [], "client": []}
    same = 0
    url = base_url.rstrip("/") + CHAT_PATH
    with (
        LlamaCppBackend(base_url, max_retries=0) as backend,
        httpx.Client(timeout=600.0, trust_env=False) as client,
    ):
        bodies = [backend.build_body(request, stream=stream) for _, request in requests]
        for _ in range(warmup):
            for body, (_, request) in zip(bodies, requests, strict=True):
                raw_call(client, url, body)
                client_call(backend, request)
        for round_index in range(rounds):
            for index, (body, (_, request)) in enumerate(zip(bodies, requests, strict=True)):
                client_first = (round_index + index) % 2 == 1
                timings: dict[str, tuple[float, int]] = {}
                for side in ("client", "raw") if client_first else ("raw", "client"):
                    started, cpu_started = time.perf_counter(), time.process_time()
                    tokens = (
                        client_call(backend, request)
                        if side == "client"
                        else raw_call(client, url, body)
                    )
                    timings[side] = (time.perf_counter() - started, tokens)
                    cpu_s[side].append(time.process_time() - cpu_started)
                raw_s.append(timings["raw"][0])
                client_s.append(timings["client"][0])
                same += timings["raw"][1] == timings["client"][1]
    return OverheadResult(
        mode=mode,
        pairs=len(raw_s),
        raw_s=tuple(raw_s),
        client_s=tuple(client_s),
        same_tokens=same,
        raw_cpu_s=tuple(cpu_s["raw"]),
        client_cpu_s=tuple(cpu_s["client"]),
    )


def measure_speedups(
    servers: Mapping[str, LlamaServer],
    requests: Sequence[tuple[str, GenerationRequest]],
    *,
    rounds: int = 3,
    baseline: str = "baseline",
) -> list[SpeedupResult]:
    """Decode speed of each server through ``LlamaCppBackend``, against ``baseline``.

    Every prompt is sent to every server in turn (order rotating per round), so all
    variants see the same machine load. Speedups are ratios of decode tokens/s from
    the servers' own timings, and of client-measured request time.

    Raises:
        ConfigError: ``baseline`` is not one of ``servers``.
    """
    if baseline not in servers:
        raise ConfigError(
            f"baseline {baseline!r} is not among {sorted(servers)}.", field="baseline"
        )
    names = list(servers)
    results = {name: SpeedupResult(name, servers[name].spec_type) for name in names}
    with ExitStack() as stack:
        backends = {
            name: stack.enter_context(server.backend(max_retries=0))
            for name, server in servers.items()
        }
        for _, request in requests[:1]:  # warm-up: load caches, start threads
            for backend in backends.values():
                backend.generate(request.replace(max_tokens=8))
        for round_index in range(rounds):
            order = names[round_index % len(names) :] + names[: round_index % len(names)]
            for prompt_id, request in requests:
                for name in order:
                    started = time.perf_counter()
                    completion = backends[name].generate(request)
                    results[name].add(prompt_id, completion, time.perf_counter() - started)
    base = results[baseline]
    for result in results.values():
        if base.decode_tokens_per_second:
            result.speedup = result.decode_tokens_per_second / base.decode_tokens_per_second
        if result.request_s:
            # The same requests, so the time ratio is the end-to-end speedup.
            result.end_to_end_speedup = base.request_s / result.request_s
        result.matches_baseline = sum(
            result.texts.get(prompt_id) == text for prompt_id, text in base.texts.items()
        )
    return [results[name] for name in names]


@dataclass(frozen=True, slots=True)
class BenchReport:
    """Everything one run measured."""

    model: str
    rounds: int
    max_tokens: int
    prompts: tuple[str, ...]
    overhead: tuple[OverheadResult, ...]
    speedups: tuple[SpeedupResult, ...]
    commands: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        """Figures as JSON-compatible values."""
        return {
            "model": self.model,
            "rounds": self.rounds,
            "max_tokens": self.max_tokens,
            "prompts": list(self.prompts),
            "overhead": [o.to_dict() for o in self.overhead],
            "speedups": [s.to_dict() for s in self.speedups],
            "commands": self.commands,
        }

    def table(self) -> str:
        """The figures as two Markdown tables."""
        lines = [
            "| mode | pairs | median raw request | median overhead | overhead (total) | "
            "client CPU overhead | same token count |",
            "|---|---|---|---|---|---|---|",
        ]
        for o in self.overhead:
            cpu = o.median_cpu_overhead_ms
            cpu_text = (
                "-" if cpu is None else (f"{cpu:+.2f} ms ({cpu / 1000.0 / o.median_raw_s:+.3%})")
            )
            lines.append(
                f"| {o.mode} | {o.pairs} | {o.median_raw_s * 1000:.1f} ms | "
                f"{o.median_overhead_ms:+.2f} ms ({o.median_overhead_ratio:+.2%}) | "
                f"{o.overhead_ratio:+.2%} | {cpu_text} | {o.same_tokens}/{o.pairs} |"
            )
        lines += [
            "",
            "| server | spec type | decode tok/s | speedup | end-to-end | acceptance | "
            "tokens/step | greedy text = baseline |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for s in self.speedups:
            rate = "-" if s.acceptance_rate is None else f"{s.acceptance_rate:.2f}"
            mal = "-" if s.mean_accepted_length is None else f"{s.mean_accepted_length:.2f}"
            lines.append(
                f"| {s.name} | {s.spec_type or 'none'} | {s.decode_tokens_per_second:.1f} | "
                f"{s.speedup or 0:.2f}x | {s.end_to_end_speedup or 0:.2f}x | {rate} | {mal} | "
                f"{s.matches_baseline}/{len(s.texts)} |"
            )
        return "\n".join(lines)


def _servers(
    model: str,
    include_draft: bool,
    threads: int | None,
    logs: Path | None,
    ngram_draft_max: Sequence[int | None],
) -> Iterator[tuple[str, LlamaServer]]:
    def log(name: str) -> Path | None:
        return None if logs is None else logs / f"llama-{name}.log"

    yield "baseline", LlamaServer(model, threads=threads, log_path=log("baseline"))
    for draft_max in ngram_draft_max:
        name = "ngram" if draft_max is None else f"ngram-m{draft_max}"
        yield (
            name,
            LlamaServer(
                model,
                spec_type="ngram-simple",
                draft_max=draft_max,
                threads=threads,
                log_path=log(name),
            ),
        )
    if include_draft:
        yield (
            "draft",
            LlamaServer(
                model, draft_model=model, draft_max=4, threads=threads, log_path=log("draft")
            ),
        )


def run_client_overhead_bench(
    *,
    model: str = "smollm2-135m",
    rounds: int = 5,
    speed_rounds: int = 2,
    max_tokens: int = 128,
    per_category: int = 2,
    include_draft: bool = True,
    threads: int | None = None,
    logs: Path | None = None,
    ngram_draft_max: Sequence[int | None] = DEFAULT_NGRAM_DRAFT_MAX,
) -> BenchReport:
    """Start the servers, measure overhead then speedups, stop the servers.

    ``ngram_draft_max`` lists the ngram-simple servers to compare, by draft length
    (``--spec-ngram-simple-size-m``); None keeps llama-server's default of 48, which
    with a 3-token lookup drafts far more than gets accepted.
    """
    requests = bench_requests(per_category=per_category, max_tokens=max_tokens)
    with ExitStack() as stack:
        servers = {
            name: stack.enter_context(server)
            for name, server in _servers(model, include_draft, threads, logs, ngram_draft_max)
        }
        base_url = servers["baseline"].base_url
        overhead = tuple(
            measure_client_overhead(base_url, requests, rounds=rounds, mode=mode)
            for mode in ("generate", "stream")
        )
        speedups = measure_speedups(servers, requests, rounds=speed_rounds)
        commands = {name: format_command(server.command) for name, server in servers.items()}
    return BenchReport(
        model=model,
        rounds=rounds,
        max_tokens=max_tokens,
        prompts=tuple(prompt_id for prompt_id, _ in requests),
        overhead=overhead,
        speedups=tuple(speedups),
        commands=commands,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; prints the tables (and writes JSON with ``--json``)."""
    parser = argparse.ArgumentParser(
        prog="python -m speculative_llm.bench.client_overhead", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--model", default="smollm2-135m", help=".gguf file or packaged alias")
    parser.add_argument("--rounds", type=int, default=5, help="overhead rounds over the prompts")
    parser.add_argument("--speed-rounds", type=int, default=2, help="speedup rounds")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--per-category", type=int, default=2, help="prompts per category")
    parser.add_argument("--no-draft", action="store_true", help="skip the draft-model server")
    parser.add_argument("--threads", type=int, help="llama-server --threads")
    parser.add_argument(
        "--ngram-draft-max",
        type=int,
        action="append",
        help="ngram-simple servers to compare, by draft length (repeatable; default 5)",
    )
    parser.add_argument("--logs", type=Path, help="folder for the servers' logs")
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    args = parser.parse_args(argv)
    report = run_client_overhead_bench(
        model=args.model,
        rounds=args.rounds,
        speed_rounds=args.speed_rounds,
        max_tokens=args.max_tokens,
        per_category=args.per_category,
        include_draft=not args.no_draft,
        threads=args.threads,
        logs=args.logs,
        ngram_draft_max=tuple(args.ngram_draft_max or DEFAULT_NGRAM_DRAFT_MAX),
    )
    print(report.table())
    for name, command in report.commands.items():
        print(f"{name}: {command}", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps(report.to_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
