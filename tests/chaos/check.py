"""The chaos run's checker: reads the event log of every process of a run (events.py)
and checks the mesh's rules (issue 26, item 9). `check(events)` returns a `Report`: the
run's figures and, per rule, how many times it was broken with a few examples.

The rules (each a key of `Report.violations`):

- `oneway_handled_twice`, `request_handled_twice`: a call's handler started more than
  once (over every node and every object lifecycle).
- `oneway_lost_uncounted`: one-ways that completed at their sender (admitted) and whose
  handler never started, beyond what the senders counted as lost
  (`MeshStatistics.dropped_after_admission`, summed over the senders' last `stats`
  events; 0 where a sender has no such figure). A counted loss is allowed (its peer was
  gone); an uncounted one is not.
- `call_terminals`: a call (request or one-way) that did not end exactly once.
- `deadline_exceeded_but_ran`: a request that ended `DeadlineExceededError` and whose
  handler started after the caller's deadline (plus `deadline_slack`, the clock bound:
  every process reads one `time.monotonic()`). A handler that started in time and whose
  reply came late is counted apart (`deadline_exceeded_started_in_time`).
- `two_lifecycles_at_once`: a turn of an object began while a turn of another lifecycle
  of the same id (another instance: after a take-over, on another node or on the same
  one) was running. A turn whose node died before it returned runs until the node's
  `node_down` event.
- `node_not_serving`: a node up at the end of the run without a successful `probe`.
- `unlogged_call_ran`: a handler ran for a call id the driver never logged (the log is
  not whole), and `no_traffic`: no call or no handler run at all; both keep a run that
  recorded nothing from passing.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RULES", "Report", "check"]

RULES = (
    "oneway_handled_twice",
    "request_handled_twice",
    "oneway_lost_uncounted",
    "call_terminals",
    "deadline_exceeded_but_ran",
    "two_lifecycles_at_once",
    "node_not_serving",
    "unlogged_call_ran",
    "no_traffic",
)
_EXAMPLES = 5


@dataclass
class Report:
    """What a run did (`counts`) and the rules it broke (`violations`: rule -> how many,
    every rule present; `examples`: rule -> a few of them)."""

    counts: dict[str, Any] = field(default_factory=dict)
    violations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RULES, 0))
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def broke(self, rule: str, example: str, count: int = 1) -> None:
        self.violations[rule] += count
        found = self.examples.setdefault(rule, [])
        if len(found) < _EXAMPLES:
            found.append(example)

    def render(self) -> str:
        lines = ["counts:"]
        lines += [f"  {name}: {value}" for name, value in self.counts.items()]
        lines.append("violations:")
        for rule in RULES:
            lines.append(f"  {rule}: {self.violations[rule]}")
            lines += [f"    e.g. {example}" for example in self.examples.get(rule, [])]
        lines.append("result: " + ("OK" if self.ok else "VIOLATIONS"))
        return "\n".join(lines)


def check(
    events: Iterable[dict[str, Any]], *, torn: int = 0, deadline_slack: float = 0.05
) -> Report:
    """Check a run's events (every process's, in any order)."""
    calls: dict[str, dict[str, Any]] = {}
    ends: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    starts: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    done: dict[tuple[str, str], float] = {}
    node_down: dict[str, float] = {}
    node_up: set[str] = set()
    probes: dict[str, bool] = {}
    dropped: dict[str, int] = {}
    faults: collections.Counter[str] = collections.Counter()
    last_t = 0.0
    for ev in events:
        kind = ev["e"]
        last_t = max(last_t, float(ev.get("t", 0.0)))
        if kind == "call":
            calls[ev["id"]] = ev
        elif kind == "end":
            ends[ev["id"]].append(ev)
        elif kind == "start":
            starts[ev["id"]].append(ev)
        elif kind == "done":
            done[(ev["id"], ev["life"])] = ev["t"]
        elif kind == "node_up":
            node_up.add(ev["node"])
        elif kind == "node_down":
            node_down[ev["node"]] = ev["t"]
        elif kind == "probe":
            probes[ev["node"]] = probes.get(ev["node"], False) or bool(ev["ok"])
        elif kind == "stats":
            dropped[ev["who"]] = max(
                dropped.get(ev["who"], 0), int(ev.get("dropped_after_admission", 0))
            )
        elif kind == "fault":
            faults[ev["fault"]] += 1

    report = Report()
    outcomes: collections.Counter[str] = collections.Counter()
    lost: list[str] = []
    in_time = failed_ran = unavailable_ran = 0
    for call_id, call in calls.items():
        runs = starts.get(call_id, [])
        finals = ends.get(call_id, [])
        outcome = finals[0]["outcome"] if finals else "none"
        outcomes[f"{call['kind']} {outcome}"] += 1
        what = f"{call['kind']} {call_id} to {call['target']}"
        if len(finals) != 1:
            report.broke("call_terminals", f"{what}: {len(finals)} terminals")
        if len(runs) > 1:
            rule = "oneway_handled_twice" if call["kind"] == "send" else "request_handled_twice"
            nodes = ", ".join(run["node"] for run in runs)
            report.broke(rule, f"{what}: {len(runs)} runs (on {nodes})")
        if call["kind"] == "send":
            if outcome == "ok" and not runs:
                lost.append(what)
            elif outcome not in ("ok", "none") and runs:
                failed_ran += 1
        elif outcome == "DeadlineExceededError" and runs:
            late = [run for run in runs if run["t"] > call["deadline"] + deadline_slack]
            if late:
                after = late[0]["t"] - call["deadline"]
                report.broke(
                    "deadline_exceeded_but_ran",
                    f"{what}: started {after:.3f} s after its deadline on {late[0]['node']}",
                )
            else:
                in_time += 1
        elif outcome == "UnavailableError" and runs:
            unavailable_ran += 1

    counted = sum(dropped.values())
    if len(lost) > counted:
        report.broke(
            "oneway_lost_uncounted",
            f"{len(lost)} lost, {counted} counted by senders; e.g. {', '.join(lost[:3])}",
            len(lost) - counted,
        )
    unlogged = [call_id for call_id in starts if call_id not in calls]
    for call_id in unlogged:
        report.broke("unlogged_call_ran", f"{call_id} ran on {starts[call_id][0]['node']}")
    if not calls or not starts:
        report.broke("no_traffic", f"{len(calls)} calls, {len(starts)} handler runs")

    unfinished = _overlaps(report, starts, done, node_down)
    for node in sorted(node_up - set(node_down)):
        if not probes.get(node, False):
            report.broke("node_not_serving", f"{node}: no successful probe after the faults")

    report.counts.update(
        calls=len(calls),
        one_ways=sum(1 for c in calls.values() if c["kind"] == "send"),
        requests=sum(1 for c in calls.values() if c["kind"] == "request"),
        **{f"outcome[{name}]": n for name, n in sorted(outcomes.items())},
        handler_runs=sum(len(r) for r in starts.values()),
        one_ways_lost=len(lost),
        losses_counted_by_senders=counted,
        failed_one_ways_that_ran=failed_ran,
        deadline_exceeded_started_in_time=in_time,
        unavailable_that_ran=unavailable_ran,
        turns_unfinished_at_a_node_death=unfinished,
        **{f"faults[{name}]": n for name, n in sorted(faults.items())},
        nodes_started=len(node_up),
        nodes_probed_ok=sum(1 for ok in probes.values() if ok),
        torn_log_lines=torn,
    )
    return report


def _overlaps(
    report: Report,
    starts: dict[str, list[dict[str, Any]]],
    done: dict[tuple[str, str], float],
    node_down: dict[str, float],
) -> int:
    """Check `two_lifecycles_at_once`; returns how many turns never returned."""
    turns: dict[str, list[tuple[float, float, str, str]]] = collections.defaultdict(list)
    unfinished = 0
    for call_id, runs in starts.items():
        for run in runs:
            end = done.get((call_id, run["life"]))
            if end is None:
                unfinished += 1
                end = node_down.get(run["node"], run["t"])
            turns[run["obj"]].append((run["t"], end, run["life"], run["node"]))
    for obj, spans in turns.items():
        spans.sort()
        busy: dict[str, tuple[float, str]] = {}  # life -> (latest end, node)
        for begin, end, life, node in spans:
            for other, (other_end, other_node) in busy.items():
                if other != life and other_end > begin:
                    report.broke(
                        "two_lifecycles_at_once",
                        f"{obj}: a turn of {life} on {node} began {other_end - begin:.3f} s "
                        f"before a turn of {other} on {other_node} ended",
                    )
                    break
            latest = busy.get(life)
            if latest is None or end > latest[0]:
                busy[life] = (end, node)
    return unfinished
