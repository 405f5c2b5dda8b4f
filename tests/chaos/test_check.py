"""The chaos run's checker on synthetic logs: a clean run passes, and each rule it
checks is caught when broken (so a run cannot pass because a check is blind)."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from .check import RULES, check
from .events import EventLog, read_events

A, B = "node-a", "node-b"


def _clean() -> list[dict[str, Any]]:
    """Two nodes up and probed; a one-way and a request to a Spot, both handled once."""
    return [
        {"e": "node_up", "node": A, "t": 0.0},
        {"e": "node_up", "node": B, "t": 0.0},
        {"e": "call", "id": "c1", "kind": "send", "target": "spot:s", "t": 1.0, "deadline": 3.0},
        {"e": "end", "id": "c1", "outcome": "ok", "t": 1.01},
        {"e": "start", "id": "c1", "obj": "spot:s", "life": "L1", "node": A, "t": 1.02},
        {"e": "done", "id": "c1", "life": "L1", "t": 1.03},
        {"e": "call", "id": "c2", "kind": "request", "target": "spot:s", "t": 2.0, "deadline": 3.0},
        {"e": "start", "id": "c2", "obj": "spot:s", "life": "L1", "node": A, "t": 2.01},
        {"e": "done", "id": "c2", "life": "L1", "t": 2.02},
        {"e": "end", "id": "c2", "outcome": "ok", "t": 2.03},
        {"e": "probe", "node": A, "ok": True, "t": 9.0},
        {"e": "probe", "node": B, "ok": True, "t": 9.0},
        {"e": "stats", "who": "driver", "dropped_after_admission": 0, "t": 9.5},
    ]


def _broken(report_rules: dict[str, int]) -> set[str]:
    return {rule for rule, count in report_rules.items() if count}


def test_a_clean_log_breaks_no_rule() -> None:
    report = check(_clean())
    assert report.ok, report.render()
    assert set(report.violations) == set(RULES)
    assert report.counts["calls"] == 2
    assert report.counts["handler_runs"] == 2
    assert "result: OK" in report.render()


def test_a_one_way_handled_twice_is_caught() -> None:
    again = {"e": "start", "id": "c1", "obj": "spot:s", "life": "L1", "node": A, "t": 1.5}
    report = check([*_clean(), again, {"e": "done", "id": "c1", "life": "L1", "t": 1.6}])
    assert _broken(report.violations) == {"oneway_handled_twice"}
    assert "result: VIOLATIONS" in report.render()


def test_a_request_handled_twice_is_caught() -> None:
    again = {"e": "start", "id": "c2", "obj": "spot:s", "life": "L1", "node": A, "t": 2.5}
    report = check([*_clean(), again, {"e": "done", "id": "c2", "life": "L1", "t": 2.6}])
    assert _broken(report.violations) == {"request_handled_twice"}


def _lost_one_way() -> list[dict[str, Any]]:
    return [
        {"e": "call", "id": "c3", "kind": "send", "target": "spot:s", "t": 3.0, "deadline": 5.0},
        {"e": "end", "id": "c3", "outcome": "ok", "t": 3.01},
    ]


_COUNTED = {"e": "stats", "who": "driver", "dropped_after_admission": 1, "t": 9.6}


def _call(
    call: str, t: float, *, kind: str = "request", target: str = "spot:s", end: float = 0.0
) -> list[dict[str, Any]]:
    """A call logged at `t` that ended ok (at `end`, else just after `t`)."""
    return [
        {"e": "call", "id": call, "kind": kind, "target": target, "t": t, "deadline": t + 5},
        {"e": "end", "id": call, "outcome": "ok", "t": end or t + 0.01},
    ]


def _run(call: str, life: str, node: str, t: float, obj: str = "spot:s") -> list[dict[str, Any]]:
    """A handler run of `call` in `life` on `node`, from `t` to `t` + 10 ms."""
    return [
        {"e": "start", "id": call, "obj": obj, "life": life, "node": node, "t": t},
        {"e": "done", "id": call, "life": life, "t": t + 0.01},
    ]


def _placed(target: str, node: str, since: float, created: bool = True) -> dict[str, Any]:
    return {
        "e": "placed",
        "target": target,
        "node": node,
        "created": created,
        "since": since,
        "t": since + 0.05,
    }


def _with_loss(*more: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The clean log, the lost one-way c3, `more`, and the sender's count of 1."""
    return [ev for chunk in (_clean(), _lost_one_way(), *more, [_COUNTED]) for ev in chunk]


def test_a_lost_one_way_no_sender_counted_is_caught() -> None:
    report = check([*_clean(), *_lost_one_way()])
    assert _broken(report.violations) == {"oneway_lost_uncounted"}
    assert report.violations["oneway_lost_uncounted"] == 1
    assert report.counts["one_ways_lost"] == 1


def test_a_lost_one_way_its_sender_counted_is_allowed() -> None:
    report = check([*_clean(), *_lost_one_way(), _COUNTED])
    assert report.ok, report.render()
    assert report.counts["losses_counted_by_senders"] == 1
    # Counted losses cover only as many: a second loss is one violation.
    second = [dict(ev, id="c4") for ev in _lost_one_way()]
    report = check([*_clean(), *_lost_one_way(), *second, _COUNTED])
    assert report.violations["oneway_lost_uncounted"] == 1


def test_a_loss_after_the_target_s_node_died_is_allowed() -> None:
    """L1 (on A) ran before the send; A went down after it and L1 never ran again; the
    target's next life (L2 on B) ran the next call."""
    down = {"e": "node_down", "node": A, "t": 3.5}
    after = [*_call("c4", 5.0), *_run("c4", "L2", B, 5.01)]
    report = check([*_clean(), *_lost_one_way(), down, *after, _COUNTED])
    assert report.ok, report.render()
    assert report.counts["one_ways_lost"] == 1
    assert report.counts["lost_while_target_lived"] == 0
    assert report.counts["lost_after_node_died"] == 1
    assert report.counts["lost_after_life_ended"] == 0
    assert "1 one-ways lost: 0 while the target lived; 1 after its node died" in report.render()


def test_a_loss_with_its_node_needs_no_sender_count_but_one_on_a_node_that_lived_does() -> None:
    """What a killed node had acknowledged and not run died with its queues, counted by
    nobody (docs/mesh.md): allowed uncounted. A loss on a node that lived (the life
    ended there: closed, fenced, taken over) must be counted by its sender."""
    down = {"e": "node_down", "node": A, "t": 3.5}
    after = [*_call("c4", 5.0), *_run("c4", "L2", B, 5.01)]
    report = check([*_clean(), *_lost_one_way(), down, *after])
    assert report.ok, report.render()
    assert report.counts["lost_after_node_died"] == 1
    report = check([*_clean(), *_lost_one_way(), *after])  # A lived
    assert _broken(report.violations) == {"oneway_lost_uncounted"}
    assert report.counts["lost_after_life_ended"] == 1


def test_a_loss_whose_target_s_life_ran_a_later_call_is_caught_though_counted() -> None:
    """The same life L1 ran a call sent after the lost one: it lived (and the sender's
    count of 1 does not excuse it)."""
    later = [*_call("c4", 3.5), *_run("c4", "L1", A, 3.6)]
    report = check([*_clean(), *_lost_one_way(), *later, _COUNTED])
    assert _broken(report.violations) == {"oneway_lost_while_target_lived"}
    assert report.counts["lost_while_target_lived"] == 1
    (example,) = report.examples["oneway_lost_while_target_lived"]
    assert example.startswith("send c3 to spot:s (admitted at 3.010): its life L1 on node-a")
    assert "ran c4" in example
    # A node that went down after that turn does not excuse it either.
    down = {"e": "node_down", "node": A, "t": 4.0}
    report = check([*_clean(), *_lost_one_way(), *later, down, _COUNTED])
    assert _broken(report.violations) == {"oneway_lost_while_target_lived"}


def test_a_loss_whose_life_lived_on_as_the_next_turn_says_within_the_ack_slack_is_allowed() -> None:
    """A turn of a later call that starts within `ack_slack` of the lost call's end does
    not count (what the sender admitted may still be on its way that long); past it,
    it does."""
    soon = [*_call("c4", 3.02), *_run("c4", "L1", A, 3.05)]
    down = {"e": "node_down", "node": A, "t": 3.2}
    assert check([*_clean(), *_lost_one_way(), *soon, down, _COUNTED]).ok
    report = check([*_clean(), *_lost_one_way(), *soon, down, _COUNTED], ack_slack=0.01)
    assert _broken(report.violations) == {"oneway_lost_while_target_lived"}


def test_a_loss_sent_just_after_its_node_was_killed_counts_as_after_its_node_died() -> None:
    """A was killed at 2.99, after L1's last turn; the one-way sent at 3.0 completed (its
    sender had not noticed yet) and was lost with A."""
    down = {"e": "node_down", "node": A, "t": 2.99}
    report = check([*_clean(), down, *_lost_one_way(), _COUNTED])
    assert report.ok, report.render()
    assert report.counts["lost_after_node_died"] == 1
    assert report.counts["lost_after_life_ended"] == 0


def test_a_turn_of_an_earlier_call_after_the_loss_is_no_evidence_the_life_lived() -> None:
    """A backlog: L1 ran c2b, sent before the lost one, 0.5 s after the loss; then its
    node went down. The lost call was behind it in the queue: allowed."""
    backlog = [*_call("c2b", 2.9, end=3.6), *_run("c2b", "L1", A, 3.5)]
    down = {"e": "node_down", "node": A, "t": 3.7}
    report = check([*_clean(), *_lost_one_way(), *backlog, down, _COUNTED])
    assert report.ok, report.render()
    assert report.counts["lost_after_node_died"] == 1


def test_a_loss_whose_life_ended_on_a_node_that_lived_is_allowed() -> None:
    """L1 on A never ran again (closed, fenced, taken over) while A lived; L2 on B ran
    the next calls. A killed after that take-over does not make it a loss to a death."""
    after = [*_call("c4", 5.0), *_run("c4", "L2", B, 5.01)]
    for later in ([], [{"e": "node_down", "node": A, "t": 6.0}]):
        report = check([*_clean(), *_lost_one_way(), *after, *later, _COUNTED])
        assert report.ok, report.render()
        assert report.counts["lost_after_life_ended"] == 1
        assert report.counts["lost_after_node_died"] == 0


def test_a_node_back_with_the_same_routing_id_brings_a_new_life() -> None:
    """A restarted with the same routing id: the objects it serves again are new lives
    (L2); L1, which the lost call was sent to, died with the first process. A (up at
    the end) still needs its probe, and a turn cut by its death ran until then."""
    restart = [
        {"e": "node_down", "node": A, "t": 3.5},
        {"e": "node_up", "node": A, "t": 4.0},
    ]
    after = [*_call("c4", 5.0), *_run("c4", "L2", A, 5.01)]
    report = check([*_clean(), *_lost_one_way(), *restart, *after, _COUNTED])
    assert report.ok, report.render()
    assert report.counts["lost_after_node_died"] == 1
    unprobed = [ev for ev in _with_loss(restart, after) if ev["e"] != "probe"]
    assert _broken(check(unprobed).violations) == {"node_not_serving"}
    # L1's turn cut by the first death (3.5) ends there, not at the second (6.0): L2's
    # turn at 5.01 overlaps nothing.
    cut = _turn("c6", "L1", A, 2.9, None)
    again = {"e": "node_down", "node": A, "t": 6.0}
    report = check([*_with_loss(restart, after), *cut, again])
    assert report.ok, report.render()
    assert report.counts["turns_unfinished_at_a_node_death"] == 1


def _never_run(node: str = A) -> list[dict[str, Any]]:
    """`spot:n`, created on `node` at 2.0, and a one-way to it lost: nothing ever ran it
    before the send."""
    return [
        _placed("spot:n", node, since=2.0),
        *_call("c8", 3.0, kind="send", target="spot:n"),
    ]


def test_a_loss_to_a_target_never_run_is_allowed_only_if_its_node_went_down() -> None:
    down = {"e": "node_down", "node": A, "t": 3.5}
    report = check([*_clean(), *_never_run(), down, _COUNTED])
    assert report.ok, report.render()
    assert report.counts["lost_after_node_died"] == 1
    # Its node lived on.
    report = check([*_clean(), *_never_run(), _COUNTED])
    assert _broken(report.violations) == {"oneway_lost_while_target_lived"}
    assert (
        "sent to an instance on node-a that had not run yet"
        in (report.examples["oneway_lost_while_target_lived"][0])
    )
    # Its node was killed just before the send (its sender still took it for live).
    early = {"e": "node_down", "node": A, "t": 2.5}
    assert check([*_clean(), *_never_run(), early, _COUNTED]).ok
    # ... but not before the creation began: that node died with nothing of it.
    earlier = {"e": "node_down", "node": A, "t": 1.5}
    report = check([*_clean(), *_never_run(), earlier, _COUNTED])
    assert _broken(report.violations) == {"oneway_lost_while_target_lived"}
    # Its node ran the instance (a later call) before it went down.
    ran = [*_call("c9", 3.2, target="spot:n"), *_run("c9", "N1", A, 3.3, obj="spot:n")]
    report = check([*_clean(), *_never_run(), *ran, down, _COUNTED])
    assert _broken(report.violations) == {"oneway_lost_while_target_lived"}
    assert "(life N1) ran c9" in report.examples["oneway_lost_while_target_lived"][0]


def test_a_loss_to_a_target_never_run_and_created_again_elsewhere_is_a_life_that_ended() -> None:
    """`spot:n` on A had not run when c8 was sent; the driver created it again on B (a
    take-over), then again on A, whose new instance ran a later call: c8's instance
    ended with the take-over (it is counted as a loss on a node that lived), and the
    later turn on A is another life's. Before, the checker held that turn against it."""
    again = [_placed("spot:n", B, since=3.5), _placed("spot:n", A, since=4.0)]
    ran = [*_call("c9", 4.2, kind="send", target="spot:n"), *_run("c9", "N2", A, 4.3, "spot:n")]
    report = check([*_clean(), *_never_run(), *again, *ran, _COUNTED])
    assert report.ok, report.render()
    assert report.counts["lost_after_life_ended"] == 1
    # The same turn before the take-over proves the instance c8 was sent to lived on.
    early = [*_call("c9", 3.2, kind="send", target="spot:n"), *_run("c9", "N1", A, 3.3, "spot:n")]
    report = check([*_clean(), *_never_run(), *again, *early, _COUNTED])
    assert _broken(report.violations) == {"oneway_lost_while_target_lived"}
    assert "before its life ended" in report.examples["oneway_lost_while_target_lived"][0]


def test_a_loss_to_a_target_never_run_nor_placed_is_caught() -> None:
    lost = _call("c8", 3.0, kind="send", target="spot:n")
    report = check([*_clean(), *lost, {"e": "node_down", "node": A, "t": 3.5}, _COUNTED])
    assert _broken(report.violations) == {"oneway_lost_while_target_lived"}
    assert "no placement of it is known" in report.examples["oneway_lost_while_target_lived"][0]


def test_a_loss_to_an_instance_created_again_and_not_run_yet_is_judged_by_its_node() -> None:
    """L1 on A ran; A went down; the driver created the Spot again on B (not run yet when
    the one-way was sent): it was sent to that instance, so B must have gone down."""
    again = [{"e": "node_down", "node": A, "t": 2.5}, _placed("spot:s", B, since=2.6)]
    report = check([*_clean(), *again, *_lost_one_way(), _COUNTED])
    assert _broken(report.violations) == {"oneway_lost_while_target_lived"}
    assert "instance on node-b" in report.examples["oneway_lost_while_target_lived"][0]
    b_down = {"e": "node_down", "node": B, "t": 3.5}
    assert check([*_clean(), *again, *_lost_one_way(), b_down, _COUNTED]).ok
    # A get-or-create that found the Spot (created: false) is no new instance.
    found = [again[0], _placed("spot:s", B, since=2.6, created=False)]
    assert check([*_clean(), *found, *_lost_one_way(), _COUNTED]).ok


def test_receivers_drops_and_the_lease_figures_are_summed_over_each_process_s_last_stats() -> None:
    def stats(src: str, who: str, t: float, **figures: int) -> dict[str, Any]:
        return {"e": "stats", "who": who, "src": src, "t": t, **figures}

    events = [
        *_clean(),
        stats("node0-1.jsonl", A, 5.0, dropped_messages=2, duplicate_messages=1),
        stats("node0-1.jsonl", A, 6.0, dropped_messages=5, duplicate_messages=1),
        stats("node1-1.jsonl", B, 6.0, dropped_messages=3, late_records=4, lease_recoveries=1),
        # A node back with the same routing id counts from 0 again: its own process.
        stats("node0-2.jsonl", A, 8.0, dropped_messages=1),
        stats("driver.jsonl", "driver", 9.7, dropped_messages=7, dropped_after_admission=2),
    ]
    report = check(events)
    assert report.ok, report.render()
    assert report.counts["dropped_at_receivers"] == 5 + 3 + 1
    assert report.counts["duplicates_at_receivers"] == 1
    assert report.counts["late_records_at_receivers"] == 4
    assert report.counts["lease_recoveries"] == 1
    assert report.counts["losses_counted_by_senders"] == 2
    assert "senders counted 2, receivers dropped 9" in report.render()


def test_drops_a_node_told_that_no_sender_counted_for_it_are_reported() -> None:
    """A told 5 (its two processes: 4 and 1), B 3; the senders counted 3 for A (the
    driver 2, node B 1) and 3 for B: 2 of A's notices were not heard."""

    def stats(src: str, who: str, **figures: Any) -> dict[str, Any]:
        return {"e": "stats", "who": who, "src": src, "t": 8.0, **figures}

    events = [
        *_clean(),
        stats("node0-1.jsonl", A, dropped_messages=4),
        stats("node0-2.jsonl", A, dropped_messages=1),
        stats("node1-1.jsonl", B, dropped_messages=3, dropped_by_peer={A: 1}),
        stats("driver.jsonl", "driver", dropped_after_admission=5, dropped_by_peer={A: 2, B: 3}),
    ]
    report = check(events)
    assert report.counts["told_not_counted"] == 2
    assert report.ok, report.render()  # reported, not judged


def test_requests_that_ended_unavailable_and_ran_are_counted_by_reason() -> None:
    def unavailable(call: str, reason: str | None, ran: bool) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = [
            {"e": "call", "id": call, "kind": "request", "target": "spot:s", "t": 4.0},
            {"e": "end", "id": call, "outcome": "UnavailableError", "reason": reason, "t": 4.5},
        ]
        return events + (_run(call, "L1", A, 4.1) if ran else [])

    events = [
        *_clean(),
        *unavailable("u1", "peer_paused", True),
        *unavailable("u2", "peer_paused", True),
        *unavailable("u3", "fenced", True),
        *unavailable("u4", "fenced", False),
        *unavailable("u5", None, True),
    ]
    report = check(events)
    assert report.ok, report.render()
    assert report.counts["unavailable_that_ran"] == 4
    assert report.counts["unavailable_that_ran_by_fault[peer_paused]"] == 2
    assert report.counts["unavailable_that_ran_by_fault[fenced]"] == 1
    assert report.counts["unavailable_that_ran_by_fault[None]"] == 1


def test_a_one_way_that_failed_at_its_sender_is_not_lost() -> None:
    failed = [_lost_one_way()[0], {"e": "end", "id": "c3", "outcome": "UnavailableError", "t": 3.2}]
    assert check([*_clean(), *failed]).ok


@pytest.mark.parametrize("ends", [0, 2])
def test_a_call_without_exactly_one_terminal_is_caught(ends: int) -> None:
    events = [ev for ev in _clean() if not (ev["e"] == "end" and ev["id"] == "c2")]
    events += [{"e": "end", "id": "c2", "outcome": "ok", "t": 2.1 + n} for n in range(ends)]
    report = check(events)
    assert _broken(report.violations) == {"call_terminals"}


def _deadline_exceeded(start: float) -> list[dict[str, Any]]:
    return [
        {
            "e": "call",
            "id": "c5",
            "kind": "request",
            "target": "actor:w",
            "t": 4.0,
            "deadline": 5.0,
        },
        {"e": "end", "id": "c5", "outcome": "DeadlineExceededError", "t": 5.0},
        {"e": "start", "id": "c5", "obj": "actor:w", "life": "W1", "node": B, "t": start},
        {"e": "done", "id": "c5", "life": "W1", "t": start + 0.01},
    ]


def test_a_deadline_exceeded_request_whose_handler_started_after_the_deadline_is_caught() -> None:
    report = check([*_clean(), *_deadline_exceeded(start=6.0)])
    assert _broken(report.violations) == {"deadline_exceeded_but_ran"}
    assert "started 1.000 s after its deadline" in report.examples["deadline_exceeded_but_ran"][0]


def test_a_handler_that_started_in_time_and_answered_late_is_counted_not_a_violation() -> None:
    report = check([*_clean(), *_deadline_exceeded(start=4.9)])
    assert report.ok, report.render()
    assert report.counts["deadline_exceeded_started_in_time"] == 1


def _turn(call: str, life: str, node: str, t0: float, t1: float | None) -> list[dict[str, Any]]:
    events = [
        {
            "e": "call",
            "id": call,
            "kind": "request",
            "target": "spot:s",
            "t": t0 - 0.1,
            "deadline": t0 + 5,
        },
        {"e": "end", "id": call, "outcome": "ok", "t": (t1 or t0) + 0.01},
        {"e": "start", "id": call, "obj": "spot:s", "life": life, "node": node, "t": t0},
    ]
    if t1 is not None:
        events.append({"e": "done", "id": call, "life": life, "t": t1})
    return events


def test_turns_of_two_lifecycles_of_one_object_at_once_are_caught() -> None:
    report = check([*_clean(), *_turn("c6", "L1", A, 5.0, 5.5), *_turn("c7", "L2", B, 5.2, 5.3)])
    assert _broken(report.violations) == {"two_lifecycles_at_once"}
    # One after the other (a take-over) is fine.
    report = check([*_clean(), *_turn("c6", "L1", A, 5.0, 5.1), *_turn("c7", "L2", B, 5.2, 5.3)])
    assert report.ok, report.render()


def test_a_turn_cut_by_its_node_s_death_runs_until_the_node_went_down() -> None:
    down = {"e": "node_down", "node": A, "t": 6.0}
    after = _turn("c7", "L2", B, 6.5, 6.6)
    report = check([*_clean(), *_turn("c6", "L1", A, 5.0, None), down, *after])
    assert report.ok, report.render()
    assert report.counts["turns_unfinished_at_a_node_death"] == 1
    during = _turn("c7", "L2", B, 5.5, 5.6)
    report = check([*_clean(), *_turn("c6", "L1", A, 5.0, None), down, *during])
    assert _broken(report.violations) == {"two_lifecycles_at_once"}


def test_a_node_up_at_the_end_without_a_successful_probe_is_caught() -> None:
    events = [ev for ev in _clean() if not (ev["e"] == "probe" and ev["node"] == B)]
    assert _broken(check(events).violations) == {"node_not_serving"}
    failed = {"e": "probe", "node": B, "ok": False, "detail": "fenced", "t": 9.0}
    assert _broken(check([*events, failed]).violations) == {"node_not_serving"}
    # A node that went down needs no probe.
    assert check([*events, {"e": "node_down", "node": B, "t": 8.0}]).ok


def test_a_handler_run_of_a_call_the_driver_never_logged_is_caught() -> None:
    stray = {"e": "start", "id": "c99", "obj": "spot:s", "life": "L1", "node": A, "t": 8.0}
    assert _broken(check([*_clean(), stray]).violations) == {"unlogged_call_ran"}


def test_an_empty_log_is_not_a_pass() -> None:
    report = check([])
    assert _broken(report.violations) == {"no_traffic"}
    nothing_ran = [ev for ev in _clean() if ev["e"] not in ("start", "done")]
    assert "no_traffic" in _broken(check(nothing_ran).violations)


def test_the_event_log_round_trips_and_counts_a_line_cut_by_a_kill(tmp_path: pathlib.Path) -> None:
    log = EventLog(tmp_path / "node0-1.jsonl")
    log.write("start", id="c1", obj="spot:s", life="L1", node=A)
    log.close()
    log.write("done", id="c1", life="L1")  # after close: nothing written
    with open(tmp_path / "node0-1.jsonl", "a") as cut:
        cut.write('{"e": "done", "id": "c1", "li')
    events, torn = read_events(tmp_path)
    assert torn == 1
    assert [(ev["e"], ev["id"], ev["src"]) for ev in events] == [("start", "c1", "node0-1.jsonl")]
