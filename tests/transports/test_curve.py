"""CURVE on both ROUTERs: accepted keys connect, any other key or plaintext is refused by
the transport's own ZAP handler and the connecting side reports the peer lost."""

from __future__ import annotations

import pytest
import zmq

import transports as t

from .helpers import FAST, WAIT, Owner, transport


def curve_config(keys: tuple[bytes, bytes], accepted: set[bytes]) -> t.TransportConfig:
    public, secret = keys
    return t.TransportConfig(
        heartbeat_interval=FAST.heartbeat_interval,
        heartbeat_timeout=FAST.heartbeat_timeout,
        curve=t.CurveConfig(public, secret, frozenset(accepted)),
    )


def test_peers_with_accepted_keys_talk_and_others_are_refused() -> None:
    a_keys, b_keys, c_keys = zmq.curve_keypair(), zmq.curve_keypair(), zmq.curve_keypair()
    a_owner, b_owner, c_owner = Owner(), Owner(), Owner()
    with (
        transport(b"B", b_owner, curve_config(b_keys, {a_keys[0]})) as b,
        transport(b"A", a_owner, curve_config(a_keys, {b_keys[0]})) as a,
        transport(b"C", c_owner, curve_config(c_keys, {b_keys[0]})) as c,
    ):
        endpoints = b.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        assert endpoints.curve_public_key == b_keys[0]
        a.connect(b"B", endpoints)
        assert a.submit_request(b"B", 9, [b"secret"]).status is t.SubmitStatus.OK
        assert a_owner.wait(lambda: len(a_owner.of_kind(t.InboundKind.REPLY)) == 1)
        assert list(a_owner.of_kind(t.InboundKind.REPLY)[0].frames) == [b"re:secret"]
        # C's key is not among B's accepted keys: the handshake is refused
        c.connect(b"B", endpoints)
        assert c_owner.wait(
            lambda: t.PeerEventKind.LOST in c_owner.event_kinds(b"B"),
            FAST.heartbeat_timeout + WAIT,
        )
        assert b.peers() == (b"A",)
        assert t.PeerEventKind.READY not in c_owner.event_kinds(b"B")


def test_curve_on_one_side_only_is_a_usage_error() -> None:
    keys = zmq.curve_keypair()
    with (
        transport(b"S", Owner(), curve_config(keys, set())) as secure,
        transport(b"P", Owner()) as plain,
    ):
        secure_end = secure.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        plain_end = plain.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        with pytest.raises(t.TransportUsageError, match="CURVE"):
            plain.connect(b"S", secure_end)
        with pytest.raises(t.TransportUsageError, match="CURVE"):
            secure.connect(b"P", plain_end)


@pytest.mark.parametrize(
    "options",
    [
        {"public_key": b"short", "secret_key": zmq.curve_keypair()[1]},
        {"public_key": zmq.curve_keypair()[0], "secret_key": b"~" * 40},
        {
            "public_key": zmq.curve_keypair()[0],
            "secret_key": zmq.curve_keypair()[1],
            "accepted_keys": {b"x"},
        },
    ],
    ids=["short", "not-z85", "not-a-frozenset"],
)
def test_a_bad_curve_key_is_a_usage_error(options: dict[str, object]) -> None:
    with pytest.raises(t.TransportUsageError):
        t.CurveConfig(**options)  # type: ignore[arg-type]
