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


def test_a_lost_one_way_no_sender_counted_is_caught() -> None:
    report = check([*_clean(), *_lost_one_way()])
    assert _broken(report.violations) == {"oneway_lost_uncounted"}
    assert report.violations["oneway_lost_uncounted"] == 1
    assert report.counts["one_ways_lost"] == 1


def test_a_lost_one_way_its_sender_counted_is_allowed() -> None:
    counted = {"e": "stats", "who": "driver", "dropped_after_admission": 1, "t": 9.6}
    report = check([*_clean(), *_lost_one_way(), counted])
    assert report.ok, report.render()
    assert report.counts["losses_counted_by_senders"] == 1
    # Counted losses cover only as many: a second loss is one violation.
    second = [dict(ev, id="c4") for ev in _lost_one_way()]
    report = check([*_clean(), *_lost_one_way(), *second, counted])
    assert report.violations["oneway_lost_uncounted"] == 1


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
