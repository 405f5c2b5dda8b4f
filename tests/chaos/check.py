"""The chaos run's checker: reads the event log of every process of a run (events.py)
and checks the mesh's rules (issue 26, item 9). `check(events)` returns a `Report`: the
run's figures and, per rule, how many times it was broken with a few examples.

The rules (each a key of `Report.violations`):

- `oneway_handled_twice`, `request_handled_twice`: a call's handler started more than
  once (over every node and every object lifecycle).
- `oneway_lost_while_target_lived`: a one-way that completed at its sender ("ok": the
  mesh admitted it) and whose handler never started (a *loss*) is judged on its own. It
  is a violation when the target's lifecycle it was sent to lived on:
  - any life of the target (an instance, the `life` token of `start` events) that ran a
    turn before the call was sent ran a turn again, starting later than the call's `end`
    plus `ack_slack` (the receiver's acknowledgement delay: what the sender admitted may
    still be on its way that long), of a call sent after this one (the driver's calls to
    one target are delivered in order, so the lost one would have run first; a turn of
    an earlier call left in the receiver's queue proves nothing);
  - or the target had not run since its latest creation before the send (never run at
    all, or created again by the driver's take-over after its last turn: `placed`
    events with `created`, the creation counted from when the driver began it) and that
    instance's life did not end: the node of that creation did not go down
    (`node_down`) after the creation began (a node killed just before the send, which
    the sender still took for live, takes the call with it) and the driver did not
    create the target again; or it ended, and before that the node ran a turn of the
    target, later than `end` + `ack_slack`, of a call sent after this one. With no
    placement known before the send, such a loss is a violation too.
  Every other loss is allowed: the lifecycle it was sent to died. Allowed losses are
  counted by why: `lost_after_node_died` (the node of the life it was sent to, the one
  with the latest turn before the send, went down after that turn and before another
  life ran the target; or the node of the new instance went down before the target was
  created again) and
  `lost_after_life_ended` (the life ended on a node that lived: closed, fenced, taken
  over).
- `oneway_lost_uncounted`: more allowed losses on nodes that lived
  (`lost_after_life_ended`) than the senders counted as lost
  (`MeshStatistics.dropped_after_admission`, summed over every process's last `stats`
  event: a peer that is gone takes its undelivered one-ways with it, and a node that
  lived and could not hand on one it had acknowledged tells its sender). A node that
  died took what it had acknowledged and not yet run with it, counted by nobody (its
  queues died with it: docs/mesh.md "One-ways across a pause"), so
  `lost_after_node_died` is not judged by count. What receivers dropped after
  acknowledging (`dropped_messages` at the nodes, from their `stats` events, written
  every second and at shutdown: a killed node's last second is missing) is reported as
  `dropped_at_receivers`, not judged; so is `told_not_counted`, summed over the nodes:
  what a node counted dropped there beyond what the senders counted for it (its
  DROPPED notices that no sender heard).
- `call_terminals`: a call (request or one-way) that did not end exactly once.
- `deadline_exceeded_but_ran`: a request that ended `DeadlineExceededError` and whose
  handler started after the caller's deadline (plus `deadline_slack`, the clock bound:
  every process reads one `time.monotonic()`). A handler that started in time and whose
  reply came late is counted apart (`deadline_exceeded_started_in_time`). Requests that
  ended `UnavailableError` and ran are allowed and counted, in all and by the `reason`
  of their end (`unavailable_that_ran_by_fault[...]`).
- `two_lifecycles_at_once`: a turn of an object began while a turn of another lifecycle
  of the same id (another instance: after a take-over, on another node or on the same
  one) was running. A turn whose node died before it returned runs until the node's
  first `node_down` event after it began.
- `node_not_serving`: a node up at the end of the run without a successful `probe`.
- `unlogged_call_ran`: a handler ran for a call id the driver never logged (the log is
  not whole), and `no_traffic`: no call or no handler run at all; both keep a run that
  recorded nothing from passing.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = ["RULES", "Report", "check"]

RULES = (
    "oneway_handled_twice",
    "request_handled_twice",
    "oneway_lost_while_target_lived",
    "oneway_lost_uncounted",
    "call_terminals",
    "deadline_exceeded_but_ran",
    "two_lifecycles_at_once",
    "node_not_serving",
    "unlogged_call_ran",
    "no_traffic",
)
_EXAMPLES = 5
#: The figures of `stats` events summed over the processes (each process's largest).
_SENDERS = "dropped_after_admission"
_RECEIVERS = ("dropped_messages", "duplicate_messages", "late_records", "lease_recoveries")


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

    def losses(self) -> str:
        """One line on the lost one-ways (for a closing note)."""
        c = self.counts
        return (
            f"{c.get('one_ways_lost', 0)} one-ways lost: "
            f"{self.violations['oneway_lost_while_target_lived']} while the target lived; "
            f"{c.get('lost_after_node_died', 0)} after its node died, "
            f"{c.get('lost_after_life_ended', 0)} after its life ended on a node that lived; "
            f"senders counted {c.get('losses_counted_by_senders', 0)}, "
            f"receivers dropped {c.get('dropped_at_receivers', 0)}"
        )

    def render(self) -> str:
        lines = ["counts:"]
        lines += [f"  {name}: {value}" for name, value in self.counts.items()]
        lines.append("violations:")
        for rule in RULES:
            lines.append(f"  {rule}: {self.violations[rule]}")
            lines += [f"    e.g. {example}" for example in self.examples.get(rule, [])]
        lines.append("losses: " + self.losses())
        lines.append("result: " + ("OK" if self.ok else "VIOLATIONS"))
        return "\n".join(lines)


class _Turn(NamedTuple):
    t: float
    life: str
    node: str
    call: str
    sent: float  # when its call was logged (inf for a call the driver never logged)


class _Placed(NamedTuple):
    since: float  # when the driver began the get-or-create
    node: str
    created: bool


def check(
    events: Iterable[dict[str, Any]],
    *,
    torn: int = 0,
    deadline_slack: float = 0.05,
    ack_slack: float = 0.1,
) -> Report:
    """Check a run's events (every process's, in any order). `ack_slack` is how long
    after a one-way completed at its sender it may still be on its way to the receiver
    (its acknowledgement delay, 50 ms, and some)."""
    calls: dict[str, dict[str, Any]] = {}
    ends: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    starts: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    done: dict[tuple[str, str], float] = {}
    node_down: dict[str, list[float]] = collections.defaultdict(list)
    node_up: dict[str, float] = {}  # node -> when it last came up
    probes: dict[str, bool] = {}
    stats: dict[tuple[str, str], dict[str, int]] = {}
    #: Each process's `dropped_by_peer`, by the peer's routing id (its largest).
    by_peer: dict[tuple[str, str], dict[str, int]] = {}
    placed: dict[str, list[_Placed]] = collections.defaultdict(list)
    faults: collections.Counter[str] = collections.Counter()
    for ev in events:
        kind = ev["e"]
        if kind == "call":
            calls[ev["id"]] = ev
        elif kind == "end":
            ends[ev["id"]].append(ev)
        elif kind == "start":
            starts[ev["id"]].append(ev)
        elif kind == "done":
            done[(ev["id"], ev["life"])] = ev["t"]
        elif kind == "node_up":
            node_up[ev["node"]] = max(node_up.get(ev["node"], ev["t"]), ev["t"])
        elif kind == "node_down":
            node_down[ev["node"]].append(ev["t"])
        elif kind == "probe":
            probes[ev["node"]] = probes.get(ev["node"], False) or bool(ev["ok"])
        elif kind == "stats":
            # Each process's counters only grow: its largest is its last.
            mine = stats.setdefault((ev.get("src", ""), ev["who"]), {})
            for name in (_SENDERS, *_RECEIVERS):
                mine[name] = max(mine.get(name, 0), int(ev.get(name, 0)))
            heard = by_peer.setdefault((ev.get("src", ""), ev["who"]), {})
            for rid, n in (ev.get("dropped_by_peer") or {}).items():
                heard[rid] = max(heard.get(rid, 0), int(n))
        elif kind == "placed":
            placed[ev["target"]].append(
                _Placed(float(ev.get("since", ev["t"])), ev["node"], bool(ev.get("created")))
            )
        elif kind == "fault":
            faults[ev["fault"]] += 1
    for times in node_down.values():
        times.sort()
    for made in placed.values():
        made.sort()

    report = Report()
    outcomes: collections.Counter[str] = collections.Counter()
    lost: list[dict[str, Any]] = []
    in_time = failed_ran = 0
    unavailable_ran: collections.Counter[str] = collections.Counter()
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
                lost.append(call)
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
            unavailable_ran[str(finals[0].get("reason"))] += 1

    judge = _Losses(calls, starts, ends, node_down, placed, ack_slack)
    allowed = 0
    for call in lost:
        allowed += judge.judge(report, call)
    counted = sum(figures.get(_SENDERS, 0) for figures in stats.values())
    # What each node that lost one-ways it acknowledged told their senders (its
    # `dropped_messages`) against what the senders counted for it: a node's notices that
    # never reached a sender show here (reported, not judged: a sender also counts, for
    # a peer gone for good, what that peer had not acknowledged).
    counted_for: collections.Counter[str] = collections.Counter()
    for heard in by_peer.values():
        counted_for.update(heard)
    told_for: collections.Counter[str] = collections.Counter()
    for (_, who), figures in stats.items():
        if who != "driver":
            told_for[who] += figures.get("dropped_messages", 0)
    told_not_counted = sum(max(0, n - counted_for[who]) for who, n in told_for.items())
    at_receivers = {
        name: sum(figures.get(name, 0) for (_, who), figures in stats.items() if who != "driver")
        for name in _RECEIVERS
    }
    # A node that died took what it had acknowledged and not yet run with it, counted
    # by nobody (docs/mesh.md "One-ways across a pause"): only the losses on nodes that
    # lived must be counted by their senders.
    must_count = allowed - judge.node_died
    if must_count > counted:
        report.broke(
            "oneway_lost_uncounted",
            f"{must_count} lost after their target's life ended on a node that lived, "
            f"{counted} counted by senders "
            f"({at_receivers['dropped_messages']} dropped at receivers); "
            f"e.g. {', '.join(judge.allowed[:3])}",
            must_count - counted,
        )
    unlogged = [call_id for call_id in starts if call_id not in calls]
    for call_id in unlogged:
        report.broke("unlogged_call_ran", f"{call_id} ran on {starts[call_id][0]['node']}")
    if not calls or not starts:
        report.broke("no_traffic", f"{len(calls)} calls, {len(starts)} handler runs")

    unfinished = _overlaps(report, starts, done, node_down)
    # Up at the end: it did not go down after it last came up (a node can come back
    # with the same routing id).
    for node in sorted(n for n, up in node_up.items() if _down_after(node_down, n, up) is None):
        if not probes.get(node, False):
            report.broke("node_not_serving", f"{node}: no successful probe after the faults")

    report.counts.update(
        calls=len(calls),
        one_ways=sum(1 for c in calls.values() if c["kind"] == "send"),
        requests=sum(1 for c in calls.values() if c["kind"] == "request"),
        **{f"outcome[{name}]": n for name, n in sorted(outcomes.items())},
        handler_runs=sum(len(r) for r in starts.values()),
        one_ways_lost=len(lost),
        lost_while_target_lived=len(lost) - allowed,
        lost_after_node_died=judge.node_died,
        lost_after_life_ended=allowed - judge.node_died,
        losses_counted_by_senders=counted,
        dropped_at_receivers=at_receivers["dropped_messages"],
        told_not_counted=told_not_counted,
        duplicates_at_receivers=at_receivers["duplicate_messages"],
        late_records_at_receivers=at_receivers["late_records"],
        lease_recoveries=at_receivers["lease_recoveries"],
        failed_one_ways_that_ran=failed_ran,
        deadline_exceeded_started_in_time=in_time,
        unavailable_that_ran=sum(unavailable_ran.values()),
        **{
            f"unavailable_that_ran_by_fault[{reason}]": n
            for reason, n in sorted(unavailable_ran.items())
        },
        turns_unfinished_at_a_node_death=unfinished,
        **{f"faults[{name}]": n for name, n in sorted(faults.items())},
        nodes_started=len(node_up),
        nodes_probed_ok=sum(1 for ok in probes.values() if ok),
        torn_log_lines=torn,
    )
    return report


def _down_after(node_down: dict[str, list[float]], node: str, t: float) -> float | None:
    """When `node` first went down after `t` (None: it did not)."""
    times = node_down.get(node, [])
    i = bisect.bisect_right(times, t)
    return times[i] if i < len(times) else None


class _Losses:
    """Judges each lost one-way (the module's `oneway_lost_while_target_lived`)."""

    def __init__(
        self,
        calls: dict[str, dict[str, Any]],
        starts: dict[str, list[dict[str, Any]]],
        ends: dict[str, list[dict[str, Any]]],
        node_down: dict[str, list[float]],
        placed: dict[str, list[_Placed]],
        ack_slack: float,
    ) -> None:
        self.calls = calls
        self.ends = ends
        self.node_down = node_down
        self.placed = placed
        self.ack_slack = ack_slack
        self.turns: dict[str, list[_Turn]] = collections.defaultdict(list)
        for call_id, runs in starts.items():
            call = calls.get(call_id)
            sent = float(call["t"]) if call is not None else float("inf")
            for run in runs:
                self.turns[run["obj"]].append(
                    _Turn(float(run["t"]), run["life"], run["node"], call_id, sent)
                )
        for turns in self.turns.values():
            turns.sort()
        self.times = {obj: [turn.t for turn in turns] for obj, turns in self.turns.items()}
        self.node_died = 0
        self.allowed: list[str] = []

    def judge(self, report: Report, call: dict[str, Any]) -> int:
        """1 if the loss of `call` is allowed (and counts why), else 0 (and reports it)."""
        target = call["target"]
        sent = float(call["t"])
        admitted = float(self.ends[call["id"]][0]["t"])
        what = f"send {call['id']} to {target} (admitted at {admitted:.3f})"
        turns = self.turns.get(target, [])
        times = self.times.get(target, [])
        cut = bisect.bisect_left(times, sent)
        before: dict[str, _Turn] = {}  # life -> its latest turn before the send
        for turn in turns[:cut]:
            before[turn.life] = turn
        after = bisect.bisect_right(times, admitted + self.ack_slack)
        for turn in turns[after:]:
            if turn.life in before and turn.sent > sent:
                report.broke(
                    "oneway_lost_while_target_lived",
                    f"{what}: its life {turn.life} on {turn.node} ran {turn.call} (sent "
                    f"{turn.sent - sent:.3f} s after it) {turn.t - admitted:.3f} s after",
                )
                return 0
        made, created = self._placement(target, sent)
        if created:  # a turn between its latest creation and the send
            ran = made is not None and bisect.bisect_left(times, made.since) < cut
        else:  # none known: the lives that ran before it are all
            ran = bool(before)
        if ran:
            return self._allowed(what, before, target)
        if made is None:
            report.broke(
                "oneway_lost_while_target_lived",
                f"{what}: no instance had run and no placement of it is known",
            )
            return 0
        # Its life ended: its node died after the creation began (after the send, or
        # before it while the sender still took that node for live), or the driver
        # created the target again (a take-over: that instance's life ended first).
        down = _down_after(self.node_down, made.node, made.since)
        again = self._created_after(target, made.since)
        ended = min((t for t in (down, again) if t is not None), default=None)
        if ended is None:
            report.broke(
                "oneway_lost_while_target_lived",
                f"{what}: sent to an instance on {made.node} that had not run yet; "
                f"that node did not go down and the target was not created again",
            )
            return 0
        for turn in turns[after:]:
            if turn.t >= ended:
                break
            if turn.node == made.node and turn.sent > sent:
                report.broke(
                    "oneway_lost_while_target_lived",
                    f"{what}: the instance on {made.node} (life {turn.life}) ran {turn.call} "
                    f"{turn.t - admitted:.3f} s after, before its life ended",
                )
                return 0
        if down is not None and down <= ended:
            self.node_died += 1
            self._note(what, f"{made.node} went down {down - admitted:+.3f} s from it")
        else:
            self._note(
                what,
                f"the instance on {made.node} had not run; the target was created again "
                f"{ended - admitted:+.3f} s from it",
            )
        return 1

    def _created_after(self, target: str, since: float) -> float | None:
        """When the driver began the first creation of `target` after `since` (None:
        it did not)."""
        return next(
            (p.since for p in self.placed.get(target, []) if p.created and p.since > since), None
        )

    def _placement(self, target: str, sent: float) -> tuple[_Placed | None, bool]:
        """The driver's latest creation of `target` begun before `sent` and True; else
        its latest placement of any kind (a get-or-create that found it) and False."""
        known = [p for p in self.placed.get(target, []) if p.since < sent]
        created = [p for p in known if p.created]
        if created:
            return created[-1], True
        return (known[-1] if known else None), False

    def _allowed(self, what: str, before: dict[str, _Turn], target: str) -> int:
        last = max(before.values())
        # Its node died after that turn (after the send, or before it while the sender
        # still took that node for live), and before another life took the target over.
        down = _down_after(self.node_down, last.node, last.t)
        if down is not None:
            turns = self.turns[target]
            for turn in turns[bisect.bisect_right(self.times[target], last.t) :]:
                if turn.t >= down:
                    break
                if turn.life != last.life:
                    down = None
                    break
        if down is not None:
            self.node_died += 1
        self._note(
            what,
            f"its life {last.life} on {last.node} ran no later call"
            + ("; then the node went down" if down is not None else ""),
        )
        return 1

    def _note(self, what: str, why: str) -> None:
        if len(self.allowed) < _EXAMPLES:
            self.allowed.append(f"{what}: {why}")


def _overlaps(
    report: Report,
    starts: dict[str, list[dict[str, Any]]],
    done: dict[tuple[str, str], float],
    node_down: dict[str, list[float]],
) -> int:
    """Check `two_lifecycles_at_once`; returns how many turns never returned."""
    turns: dict[str, list[tuple[float, float, str, str]]] = collections.defaultdict(list)
    unfinished = 0
    for call_id, runs in starts.items():
        for run in runs:
            end = done.get((call_id, run["life"]))
            if end is None:
                unfinished += 1
                down = _down_after(node_down, run["node"], run["t"])
                end = run["t"] if down is None else down
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
