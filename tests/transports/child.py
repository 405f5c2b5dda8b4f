"""A transport in a child process, for the two-process tests: `child.py MODE`.

MODE `echo` replies to every request and releases credit; `hold` never releases credit
(its sender parks). It prints its two endpoints on one line, then serves until stdin
closes or it is killed.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import transports as t


def main() -> None:
    mode = sys.argv[1]
    config = t.TransportConfig(
        heartbeat_interval=0.1, heartbeat_timeout=0.6, credit_window=64 * 1024
    )
    holder: list[t.Transport] = []

    def on_receive(batch: Sequence[t.Inbound]) -> None:
        tr = holder[0]
        for record in batch:
            if mode == "echo":
                if record.charge:
                    tr.release(record.peer, record.charge)
                if record.kind is t.InboundKind.REQUEST:
                    tr.reply(record.peer, record.route_id, record.frames)

    with t.Transport(b"CHILD", on_receive, config=config) as tr:
        holder.append(tr)
        endpoints = tr.bind("tcp://127.0.0.1:*", "tcp://127.0.0.1:*")
        print(endpoints.application, endpoints.completion, flush=True)
        sys.stdin.read()  # until the parent closes stdin


if __name__ == "__main__":
    main()
