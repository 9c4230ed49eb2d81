"""Prometheus metrics in the text exposition format (version 0.0.4), with no client library: counters,
gauges and histograms with labels, and one registry per process that `/metrics` renders.

Names follow Prometheus's conventions: `_total` for counters, base units (seconds, bytes)."""

from __future__ import annotations

import math
import threading
from typing import Callable, Iterable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# per-stage latencies of a caller's turn: 5 ms .. 5 s
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple[str, ...], extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x)) if not float(x).is_integer() else str(int(x))


class Metric:
    kind = ""

    def __init__(self, name: str, help: str, labels: tuple[str, ...] = ()):
        self.name, self.help, self.label_names = name, help, labels
        self._lock = threading.Lock()

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.label_names):
            raise ValueError(f"{self.name}: labels {sorted(labels)} are not {sorted(self.label_names)}")
        return tuple(str(labels[n]) for n in self.label_names)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]

    def samples(self) -> list[str]:
        raise NotImplementedError


class Counter(Metric):
    kind = "counter"

    def __init__(self, name: str, help: str, labels: tuple[str, ...] = ()):
        super().__init__(name, help, labels)
        self._values: dict[tuple[str, ...], float] = {} if labels else {(): 0.0}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        if amount < 0:
            raise ValueError(f"{self.name}: a counter only goes up")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        return self._values.get(self._key(labels), 0.0)

    def samples(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return [f"{self.name}{_labels(self.label_names, k)} {_number(v)}" for k, v in items]


class Gauge(Metric):
    """A value read when scraped (`read` returns it, or label values → value). `kind="counter"`
    for a count kept elsewhere (a SIP thread's), read as it is."""

    kind = "gauge"

    def __init__(self, name: str, help: str, read: Callable[[], float | dict[tuple[str, ...], float]],
                 labels: tuple[str, ...] = (), kind: str = "gauge"):
        super().__init__(name, help, labels)
        self.read = read
        self.kind = kind

    def samples(self) -> list[str]:
        got = self.read()
        items = sorted(got.items()) if isinstance(got, dict) else [((), got)]
        return [f"{self.name}{_labels(self.label_names, k)} {_number(v)}" for k, v in items]


class Histogram(Metric):
    kind = "histogram"

    def __init__(self, name: str, help: str, buckets: Iterable[float], labels: tuple[str, ...] = ()):
        super().__init__(name, help, labels)
        self.buckets = tuple(sorted(buckets))
        self._series: dict[tuple[str, ...], list] = {}  # key → [counts per bucket..., sum, count]

    def observe(self, value: float, **labels: str) -> None:
        key = self._key(labels)
        with self._lock:
            s = self._series.setdefault(key, [0] * len(self.buckets) + [0.0, 0])
            for i, bound in enumerate(self.buckets):
                if value <= bound:
                    s[i] += 1
            s[-2] += value
            s[-1] += 1

    def count(self, **labels: str) -> int:
        s = self._series.get(self._key(labels))
        return s[-1] if s else 0

    def samples(self) -> list[str]:
        out = []
        with self._lock:
            items = sorted((k, list(v)) for k, v in self._series.items())
        for key, s in items:
            for bound, n in [*zip(self.buckets, s), (math.inf, s[-1])]:
                le = 'le="' + (_number(bound) if math.isinf(bound) else repr(float(bound))) + '"'
                out.append(f"{self.name}_bucket{_labels(self.label_names, key, le)} {n}")
            out.append(f"{self.name}_sum{_labels(self.label_names, key)} {_number(s[-2])}")
            out.append(f"{self.name}_count{_labels(self.label_names, key)} {s[-1]}")
        return out


class Registry:
    def __init__(self):
        self._metrics: list[Metric] = []

    def add(self, metric: Metric) -> Metric:
        if any(m.name == metric.name for m in self._metrics):
            raise ValueError(f"metric {metric.name} is registered twice")
        self._metrics.append(metric)
        return metric

    def render(self) -> str:
        lines: list[str] = []
        for m in self._metrics:
            lines += m.header() + m.samples()
        return "\n".join(lines) + "\n"
