"""The flow notices of a peer's targets (FULL and OPEN: docs/mesh.md "One full target"),
read before `Handshake`'s notices; they go to `Delivery`. The calls that leave this node
are `outbound.Outbound`'s."""

from __future__ import annotations

import transports as t

from . import codec as wire
from .handshake import Handshake

__all__ = ["Calls"]


class Calls(Handshake):
    """The flow notices FULL and OPEN (see the module docstring)."""

    def _receive_notice(self, rec: t.Inbound) -> None:
        """FULL and OPEN of a target of the peer; the other notices as `Handshake`'s."""
        try:
            env = wire.ENVELOPE_DECODER.decode(rec.frames[0])
        except Exception:  # `Handshake._receive_notice` decodes it again and says why
            env = None
        if env is None or env.command not in (wire.FULL, wire.OPEN):
            super()._receive_notice(rec)
            return
        peer = self._peers.by_conn.get(rec.peer)
        if peer is None:
            return  # from a connection whose peer is gone: nothing waits for it
        if env.command == wire.OPEN:
            self.delivery.open(peer, (env.target_kind, env.target), env.route)
        else:
            self.delivery.full(rec.peer, env, peer)
