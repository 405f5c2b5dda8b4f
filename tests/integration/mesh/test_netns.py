"""The partition helper itself (netns.py): namespaces reach each other and the test over
the bridge, a cut link drops their packets until it is healed, and nothing is left
afterwards, also when the block fails."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from .netns import Network, network

#: A child that listens on ADDRESS:PORT inside its namespace and accepts until killed.
_SERVER = """
import socket, sys
s = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("up", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"hi")
    c.close()
"""

_CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as c:
        print(c.recv(2).decode())
except OSError as exc:
    print(type(exc).__name__)
"""


def _connect(net: Network, i: int, address: str, timeout: float) -> str:
    result = subprocess.run(
        [*net.prefix(i), sys.executable, "-c", _CLIENT, address, "7300", str(timeout)],
        capture_output=True,
        text=True,
        timeout=timeout + 10,
        check=True,
    )
    return result.stdout.strip()


def _connect_here(address: str, timeout: float) -> str:
    try:
        with socket.create_connection((address, 7300), timeout=timeout) as c:
            return c.recv(2).decode()
    except OSError as exc:
        return type(exc).__name__


def test_namespaces_talk_over_the_bridge_a_cut_drops_packets_until_healed_and_all_is_removed() -> (
    None
):
    with network(2, host_link=True) as net:
        a, b = net.namespaces
        server = subprocess.Popen(
            [*net.prefix(1), sys.executable, "-c", _SERVER, b.address, "7300"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None
            assert server.stdout.readline().strip() == "up"
            assert _connect(net, 0, b.address, 5.0) == "hi"
            assert _connect_here(b.address, 5.0) == "hi"
            net.cut(1)
            assert _connect(net, 0, b.address, 0.5) == "TimeoutError"
            assert _connect_here(b.address, 0.5) == "TimeoutError"
            net.heal(1)
            assert _connect(net, 0, b.address, 5.0) == "hi"
            assert a.address != b.address
        finally:
            server.kill()
            server.wait(5)
            server.stdout.close()  # type: ignore[union-attr]
    assert not net.exists()
    assert not net.namespaces


def _fail_inside(made: list[Network]) -> None:
    with network(3) as net:
        made.append(net)
        assert net.exists()
        assert len(net.namespaces) == 3
        raise RuntimeError("boom")


def test_the_network_is_removed_when_the_block_fails() -> None:
    made: list[Network] = []
    with pytest.raises(RuntimeError, match="boom"):
        _fail_inside(made)
    assert made
    assert not made[0].exists()
