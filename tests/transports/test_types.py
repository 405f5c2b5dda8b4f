"""The configuration checks and the submit-result shape (`transports._types`)."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

import transports as t


@pytest.mark.parametrize(
    "options",
    [
        {"credit_window": 0},
        {"credit_window": 1.5},
        {"min_charge": True},
        {"min_charge": 1000, "credit_window": 100},
        {"max_message_size": -1},
        {"hard_message_cap": 10, "max_message_size": 100},
        {"slots": 0},
        {"batch": 0},
        {"heartbeat_interval": 0},
        {"heartbeat_timeout": -1.0},
        {"heartbeat_interval": 2.0, "heartbeat_timeout": 1.0},
    ],
)
def test_a_bad_config_is_a_usage_error(options: dict[str, object]) -> None:
    with pytest.raises(t.TransportUsageError):
        t.TransportConfig(**options)  # type: ignore[arg-type]


def test_the_usage_errors_are_value_errors_and_transport_errors() -> None:
    for error in (t.UnknownPeer, t.PayloadTooLarge, t.InvalidRelease):
        assert issubclass(error, t.TransportUsageError)
        assert issubclass(error, ValueError)
    for error in (t.PeerLost, t.Closed, t.MalformedFrame):
        assert issubclass(error, t.TransportError)
        assert not issubclass(error, ValueError)


def test_the_frame_cap_sits_above_the_message_size() -> None:
    config = t.TransportConfig(max_message_size=1000)
    assert config.frame_cap > 1000
    assert t.TransportConfig(max_message_size=1000, hard_message_cap=1001).frame_cap == 1001


def test_no_slot_is_backpressured_without_a_future() -> None:
    assert t.SubmitResult(t.SubmitStatus.BACKPRESSURED).no_slot
    assert not t.SubmitResult(t.SubmitStatus.BACKPRESSURED, Future()).no_slot
    assert not t.SubmitResult(t.SubmitStatus.OK).no_slot
