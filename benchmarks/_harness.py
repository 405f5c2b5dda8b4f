"""Run a scenario's cases alternately, with a warm-up and repetitions, and report ratios.

Each case is a callable returning a dict of metrics (seconds, rates, bytes). Cases of one
scenario run in the same process, alternating zlink-actors and the peer, so that drift in
the machine's speed hits both alike.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

Metrics = dict[str, float]
Case = Callable[[], Metrics]


@dataclass
class Metric:
    """How to read and compare one metric."""

    name: str
    unit: str
    higher_is_better: bool
    #: The budget: the zlink/peer ratio must be >= (or <=, for lower-is-better) this.
    target: float | None = None


@dataclass
class Scenario:
    title: str
    zlink: Case
    peer: Case | None
    peer_name: str
    metrics: list[Metric]
    notes: list[str] = field(default_factory=list)


@dataclass
class Result:
    scenario: Scenario
    zlink: dict[str, list[float]]
    peer: dict[str, list[float]]


def run(scenario: Scenario, repetitions: int, warmup: bool = True) -> Result:
    cases: list[tuple[str, Case]] = [("zlink", scenario.zlink)]
    if scenario.peer is not None:
        cases.append(("peer", scenario.peer))
    samples: dict[str, dict[str, list[float]]] = {"zlink": {}, "peer": {}}
    if warmup:
        for _, case in cases:
            case()
    for _ in range(repetitions):
        for name, case in cases:
            gc.collect()
            for key, value in case().items():
                samples[name].setdefault(key, []).append(value)
    return Result(scenario, samples["zlink"], samples["peer"])


def run_shared(scenarios: list[Scenario], repetitions: int, warmup: bool = True) -> list[Result]:
    """Scenarios that share one zlink case (the same callable) against different peers:
    each repetition runs the zlink case once and every peer once, alternating, so each
    line's two sides come from the same minutes; every Result holds the shared samples."""
    shared = scenarios[0].zlink
    assert all(sc.zlink is shared for sc in scenarios), "run_shared needs one zlink case"
    cases: list[tuple[int, Case]] = [(-1, shared)]
    cases += [(i, sc.peer) for i, sc in enumerate(scenarios) if sc.peer is not None]
    samples: dict[int, dict[str, list[float]]] = {i: {} for i, _ in cases}
    if warmup:
        for _, case in cases:
            case()
    for _ in range(repetitions):
        for i, case in cases:
            gc.collect()
            for key, value in case().items():
                samples[i].setdefault(key, []).append(value)
    return [Result(sc, samples[-1], samples.get(i, {})) for i, sc in enumerate(scenarios)]


def in_flight(
    n: int, window: int, send: Callable[[int], object], wait_one: Callable[[], object]
) -> float:
    """Seconds for `n` calls with at most `window` in flight: `send(i)` starts call `i`,
    `wait_one()` waits for the oldest one still in flight."""
    inflight = 0
    start = time.perf_counter()
    for i in range(n):
        if inflight == window:
            wait_one()
            inflight -= 1
        send(i)
        inflight += 1
    for _ in range(inflight):
        wait_one()
    return time.perf_counter() - start


def _fmt(value: float, unit: str) -> str:
    if unit == "us":
        return f"{value:,.1f} us"
    if unit == "s":
        return f"{value:,.3f} s"
    if unit == "KiB":
        return f"{value:,.1f} KiB"
    if unit == "/s":
        return f"{value:,.0f}/s"
    if unit == "count":
        return f"{value:,.0f}"
    return f"{value:,.2f} {unit}".rstrip()


def _span(values: list[float], unit: str) -> str:
    """`median [min .. max]`."""
    med = statistics.median(values)
    return f"{_fmt(med, unit):>16} [{_fmt(min(values), unit)} .. {_fmt(max(values), unit)}]"


def report(result: Result) -> tuple[list[str], list[tuple[str, float, float | None, bool]]]:
    """Lines to print, and (metric, ratio, target, met) for the budget check."""
    sc = result.scenario
    lines = [f"== {sc.title}", f"   peer: {sc.peer_name}"]
    checks: list[tuple[str, float, float | None, bool]] = []
    for metric in sc.metrics:
        z = result.zlink.get(metric.name)
        if not z:
            continue
        zmed = statistics.median(z)
        row = f"   {metric.name:<28} zlink {_span(z, metric.unit)}"
        p = result.peer.get(metric.name)
        if p:
            pmed = statistics.median(p)
            ratio = zmed / pmed if pmed else float("inf")
            row += f"   peer {_span(p, metric.unit)}   zlink/peer {ratio:.2f}x"
            if metric.target is not None:
                met = ratio >= metric.target if metric.higher_is_better else ratio <= metric.target
                sign = ">=" if metric.higher_is_better else "<="
                row += f"  (target {sign} {metric.target}x: {'met' if met else 'MISSED'})"
                checks.append((f"{sc.title}: {metric.name}", ratio, metric.target, met))
        lines.append(row)
    for note in sc.notes:
        lines.append(f"   note: {note}")
    return lines, checks


class Machine:
    """What else the machine did while a scenario ran: the share of CPU time its
    hypervisor took (steal, from /proc/stat) and the load average. On a shared VM every
    figure above depends on it, so each scenario reports it. Empty where /proc is not."""

    def __init__(self) -> None:
        self._start = _cpu_times()

    def line(self) -> str:
        end = _cpu_times()
        if self._start is None or end is None:
            return ""
        total = sum(end) - sum(self._start)
        # /proc/stat's cpu line: user nice system idle iowait irq softirq steal ...
        steal = end[7] - self._start[7] if len(end) > 7 else 0
        with open("/proc/loadavg") as loadavg:
            load = loadavg.read().split()[0]
        share = steal / total if total > 0 else 0.0
        return f"   machine: steal (the hypervisor's share of CPU time) {share:.0%}; load {load}"


def _cpu_times() -> list[int] | None:
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    return [int(value) for value in fields[1:]] if fields and fields[0] == "cpu" else None
