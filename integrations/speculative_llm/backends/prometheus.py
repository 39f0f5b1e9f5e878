"""A small parser for the Prometheus text exposition format (``GET /metrics``).

Used to turn server-wide speculative-decoding counters into per-request figures by
taking their difference around a request (vLLM ``vllm:spec_decode_*_total``, llama-server
``llamacpp:spec_decode_*_total`` with ``--metrics``). Format reference:
https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["MetricSample", "MetricsSnapshot", "parse_prometheus_text"]


@dataclass(frozen=True, slots=True)
class MetricSample:
    """One sample line: a metric name, its labels and its value."""

    name: str
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """All samples of one scrape, indexed by metric name."""

    samples: Mapping[str, tuple[MetricSample, ...]] = field(default_factory=dict)

    def __contains__(self, name: object) -> bool:
        return name in self.samples

    def total(self, name: str, **label_filter: str) -> float | None:
        """Sum of every sample named ``name`` whose labels match ``label_filter``.

        Returns None when no such sample exists (the server does not export it).
        """
        rows = [
            s
            for s in self.samples.get(name, ())
            if all(s.labels.get(k) == v for k, v in label_filter.items())
        ]
        if not rows:
            return None
        return sum(s.value for s in rows)

    def by_label(self, name: str, label: str, **label_filter: str) -> dict[str, float]:
        """Sum of the samples named ``name`` grouped by the value of ``label``."""
        grouped: dict[str, float] = {}
        for sample in self.samples.get(name, ()):
            if not all(sample.labels.get(k) == v for k, v in label_filter.items()):
                continue
            key = sample.labels.get(label)
            if key is not None:
                grouped[key] = grouped.get(key, 0.0) + sample.value
        return grouped


def parse_prometheus_text(text: str) -> MetricsSnapshot:
    r"""Parse a ``/metrics`` body; lines that do not parse are skipped.

    Example:
        >>> snap = parse_prometheus_text('a_total{x="1"} 2\na_total{x="2"} 3\n')
        >>> snap.total("a_total")
        5.0
    """
    samples: dict[str, list[MetricSample]] = {}
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        sample = _parse_sample(line)
        if sample is not None:
            samples.setdefault(sample.name, []).append(sample)
    return MetricsSnapshot({name: tuple(rows) for name, rows in samples.items()})


def _parse_sample(line: str) -> MetricSample | None:
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        parsed = _parse_labels(line, brace + 1)
        if parsed is None:
            return None
        labels, end = parsed
        rest = line[end:].strip()
    else:
        if space == -1:
            return None
        name, rest = line[:space], line[space:].strip()
        labels = {}
    if not name or not rest:
        return None
    value = _parse_value(rest.split()[0])
    if value is None:
        return None
    return MetricSample(name=name, labels=labels, value=value)


def _parse_labels(line: str, start: int) -> tuple[dict[str, str], int] | None:
    """Parse ``key="value",...}`` from ``start``; returns the labels and the index after ``}``."""
    labels: dict[str, str] = {}
    index, length = start, len(line)
    while index < length:
        while index < length and line[index] in " ,":
            index += 1
        if index < length and line[index] == "}":
            return labels, index + 1
        equals = line.find("=", index)
        if equals == -1 or equals + 1 >= length or line[equals + 1] != '"':
            return None
        key = line[index:equals].strip()
        index = equals + 2
        chars: list[str] = []
        while index < length:
            char = line[index]
            if char == "\\" and index + 1 < length:
                escaped = line[index + 1]
                chars.append("\n" if escaped == "n" else escaped)
                index += 2
                continue
            if char == '"':
                break
            chars.append(char)
            index += 1
        else:
            return None
        labels[key] = "".join(chars)
        index += 1
    return None


def _parse_value(token: str) -> float | None:
    lowered = token.lower()
    if lowered in ("+inf", "inf"):
        return math.inf
    if lowered == "-inf":
        return -math.inf
    try:
        return float(token)
    except ValueError:
        return None
