"""Network namespaces for partition tests: `Network(count)` creates `count` namespaces,
each joined by a veth pair to one bridge in a hub namespace of its own, with an IPv4
address of the test's choosing inside each (`10.X.Y.1`, `.2`, ... by default), and
optionally a veth from this (the test's) namespace into the same bridge, so the test
process can reach nodes started inside the namespaces.

- `net.prefix(i)` is the argv prefix that runs a command inside namespace `i`
  (`ip netns exec NAME`): give it to `NodeProcesses.launch(wrap=...)`;
- `net.cut(i)` / `net.heal(i)` set the hub's end of namespace `i`'s veth down / up
  (`ip link set ... down/up`): packets to and from `i` are dropped silently, as in a
  real partition (the namespace keeps its address and routes, so nothing fails locally
  at once); `net.cut_host()` / `net.heal_host()` do the same for the test's own link;
- `net.remove()` deletes every namespace and link it made (idempotent); `with
  Network(...) as net:` and the `network()` context manager call it in a finally.

`network(count)` skips the test, with the reason printed, when `ip netns add` fails (no
root, no `ip`, a container without CAP_SYS_ADMIN). Names carry a random tag, so parallel
tests never share a namespace or a link.
"""

from __future__ import annotations

import contextlib
import ipaddress
import random
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

__all__ = ["Namespace", "Network", "NetnsUnavailable", "network"]

#: Bound for one `ip` command.
_IP_WAIT = 10.0


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be created here (the message says why)."""


@dataclass(frozen=True)
class Namespace:
    """One namespace of a `Network`."""

    name: str
    #: Its IPv4 address on the bridge (what a node there listens on and advertises).
    address: str
    #: Its veth end inside the namespace.
    inner: str
    #: The other end, in the hub namespace (what `cut` sets down).
    outer: str

    def prefix(self) -> list[str]:
        """The argv prefix that runs a command inside this namespace."""
        return ["ip", "netns", "exec", self.name]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=_IP_WAIT, check=False
    )
    if check and result.returncode != 0:
        raise NetnsUnavailable(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")
    return result


@dataclass
class Network:
    """`count` namespaces on one bridge (see the module docstring).

    `subnet` is a /24 as `"10.X.Y"`; namespace `i` gets `subnet.(i+1)`, the test's own
    link (with `host_link=True`) `subnet.254`. The default subnet is random in 10.64/10,
    so that the test's own link never meets another test's routes.
    """

    count: int = 2
    subnet: str | None = None
    host_link: bool = False
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    namespaces: list[Namespace] = field(default_factory=list)
    _made: list[str] = field(default_factory=list)  # namespaces made, for remove()
    _host_veth: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.count <= 200:
            raise ValueError(f"count {self.count}: 1..200 namespaces")
        if self.subnet is None:
            self.subnet = f"10.{random.randint(64, 127)}.{random.randint(0, 255)}"
        ipaddress.IPv4Network(f"{self.subnet}.0/24")  # raises for a bad subnet
        self.hub = f"zl{self.tag}h"
        self.bridge = f"zl{self.tag}b"

    # -- set up and remove --------------------------------------------------------------

    def create(self) -> Network:
        """Make the hub, the bridge and every namespace; on any failure remove what was
        made and raise `NetnsUnavailable`."""
        if shutil.which("ip") is None:
            raise NetnsUnavailable("no `ip` command (iproute2) on the PATH")
        try:
            self._add_namespace(self.hub)
            _ip("-n", self.hub, "link", "add", self.bridge, "type", "bridge")
            _ip("-n", self.hub, "link", "set", self.bridge, "up")
            for i in range(self.count):
                name = f"zl{self.tag}n{i}"
                self._add_namespace(name)
                inner, outer = f"zl{self.tag}i{i}", f"zl{self.tag}o{i}"
                address = f"{self.subnet}.{i + 1}"
                _ip(
                    "link",
                    "add",
                    inner,
                    "netns",
                    name,
                    "type",
                    "veth",
                    "peer",
                    outer,
                    "netns",
                    self.hub,
                )
                _ip("-n", name, "addr", "add", f"{address}/24", "dev", inner)
                _ip("-n", name, "link", "set", inner, "up")
                _ip("-n", self.hub, "link", "set", outer, "master", self.bridge)
                _ip("-n", self.hub, "link", "set", outer, "up")
                self.namespaces.append(Namespace(name, address, inner, outer))
            if self.host_link:
                inner, outer = f"zl{self.tag}t", f"zl{self.tag}u"
                _ip("link", "add", inner, "type", "veth", "peer", outer, "netns", self.hub)
                self._host_veth = inner
                _ip("addr", "add", f"{self.host_address}/24", "dev", inner)
                _ip("link", "set", inner, "up")
                _ip("-n", self.hub, "link", "set", outer, "master", self.bridge)
                _ip("-n", self.hub, "link", "set", outer, "up")
        except BaseException:
            self.remove()
            raise
        return self

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def remove(self) -> None:
        """Delete every namespace and link made (their veths go with them); idempotent."""
        if self._host_veth is not None:
            _ip("link", "del", self._host_veth, check=False)
            self._host_veth = None
        while self._made:
            _ip("netns", "del", self._made.pop(), check=False)
        self.namespaces.clear()

    def __enter__(self) -> Network:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # -- use --------------------------------------------------------------------------

    @property
    def host_address(self) -> str:
        """The test's own address on the bridge (with `host_link=True`)."""
        return f"{self.subnet}.254"

    def prefix(self, i: int) -> list[str]:
        """The argv prefix that runs a command inside namespace `i`."""
        return self.namespaces[i].prefix()

    def cut(self, i: int) -> None:
        """Partition namespace `i` from every other one (and from the test)."""
        _ip("-n", self.hub, "link", "set", self.namespaces[i].outer, "down")

    def heal(self, i: int) -> None:
        """Join namespace `i` to the bridge again."""
        _ip("-n", self.hub, "link", "set", self.namespaces[i].outer, "up")

    def cut_host(self) -> None:
        """Partition the test's own link (with `host_link=True`)."""
        _ip("-n", self.hub, "link", "set", f"zl{self.tag}u", "down")

    def heal_host(self) -> None:
        _ip("-n", self.hub, "link", "set", f"zl{self.tag}u", "up")

    def exists(self) -> bool:
        """True while any namespace of this network is listed by `ip netns`."""
        listed = _ip("netns", "list", check=False).stdout
        return any(f"zl{self.tag}" in line for line in listed.splitlines())


@contextlib.contextmanager
def network(count: int = 2, **options: object) -> Iterator[Network]:
    """A `Network` for the block, removed at its end (also when the test fails); the test
    is skipped, with the reason printed, when namespaces cannot be created here."""
    net = Network(count, **options)  # type: ignore[arg-type]
    try:
        net.create()
    except NetnsUnavailable as exc:
        reason = f"network namespaces unavailable: {exc}"
        print(reason)
        pytest.skip(reason)
    try:
        yield net
    finally:
        net.remove()
