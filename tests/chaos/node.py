"""One node of the chaos run in a process of its own: `python -m tests.chaos.node
'<json config>'`, launched by the test kit's `NodeProcesses` (tests/integration/mesh/
nodes.py). Config keys: `mesh`, `listen`, `liveness_interval`, `liveness_timeout`, `lease`
(`LeaseConfig` keywords), `mesh_options` (any other `MeshConfig` keywords, such as
`peer_expiry`), `redis` (`url`, `key_prefix`), `log` (this process's event file),
`stats_interval` (seconds between two `stats` events, 1.0).

It hosts `Tally` and `Walker` (model.py), prints `{"routing_id", "endpoint"}` once
started, logs its mesh statistics (`stats`, model.mesh_figures) every `stats_interval`
while it serves, until stdin closes or SIGTERM, then logs them once more and shuts down.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time
from typing import Any

import zlink_actors as z

from .events import EventLog, log_lines
from .model import ALL_TYPES, ChaosControl, Tally, Walker, mesh_figures, set_host, set_log


def _watch_stdin(stop: threading.Event) -> None:
    sys.stdin.read()  # until the run closes our stdin (or dies)
    stop.set()


def main() -> int:
    config: dict[str, Any] = json.loads(sys.argv[1])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    log = EventLog(config["log"])
    set_log(log)
    log_lines(logging.StreamHandler())  # stderr: the run keeps it next to the events
    store = z.RedisLocationStore(config["redis"]["url"], key_prefix=config["redis"]["key_prefix"])
    host = z.Host(
        spots=[Tally],
        actors=[Walker],
        node_handler=ChaosControl,
        mesh=z.MeshConfig(
            config["mesh"],
            listen=config.get("listen", "tcp://127.0.0.1:0"),
            liveness_interval=config["liveness_interval"],
            liveness_timeout=config["liveness_timeout"],
            lease=z.LeaseConfig(**config["lease"]),
            **config.get("mesh_options", {}),
        ),
        location=store,
        message_types=ALL_TYPES,
    )
    set_host(host)
    outcome = "not started"
    try:
        host.start()
        info = host.node
        print(json.dumps({"routing_id": info.routing_id, "endpoint": info.endpoint}), flush=True)
        threading.Thread(target=_watch_stdin, args=(stop,), daemon=True).start()
        interval = float(config.get("stats_interval", 1.0))
        due = time.monotonic() + interval
        while not stop.wait(0.1):  # wake now and then so SIGTERM's handler runs
            if time.monotonic() >= due:
                log.write("stats", who=info.routing_id, **mesh_figures(host))
                due = time.monotonic() + interval
        log.write("stats", who=info.routing_id, **mesh_figures(host))
    finally:
        result = host.shutdown(5.0)
        outcome = result.outcome.value
        store.close()
        log.close()
    print(json.dumps({"stopped": outcome}), flush=True)
    return 0 if result.outcome is z.ShutdownOutcome.STOPPED else 3


if __name__ == "__main__":
    sys.exit(main())
