"""The chaos run's event log: every process appends JSON lines to a file of its own, one
`os.write` per line on an `O_APPEND` descriptor, so a line written before a SIGKILL is in
the file; `read_events` reads every file of a run's directory afterwards.

Events (`e` is the kind; `t` is `time.monotonic()`, one clock for every process of the
machine):

- driver: `call` (`id`, `kind` "send" / "request", `target` "spot:ID" / "actor:ID",
  `deadline`), `end` (`id`, `outcome` "ok" or the error's class name, `reason`: the
  `UnavailableReason` value or null), `placed` (`target`, `node`: where a get-or-create
  of the driver found or made it, `created`: whether it made it, `since`: when the call
  began), `fault` (`fault`, `node`, `t0`, `t1`), `node_up` / `node_down` (`node`: a
  routing id), `probe` (`node`, `ok`, `detail`), `stats` (`who` "driver", its mesh
  statistics: model.mesh_figures) once at the end;
- nodes: `start` (`id`, `obj`, `life`: the object instance's token, `node`) when a
  handler begins, `done` (`id`, `life`) when it returns, `stats` (`who`: its routing
  id) every second and at shutdown.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import threading
import time
from typing import Any

__all__ = ["EventLog", "log_lines", "read_events"]


class EventLog:
    """An append-only JSON-lines file of one process (thread-safe)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"e": event, "t": time.monotonic(), **fields}, separators=(",", ":"))
        with self._lock:
            if self._fd >= 0:
                os.write(self._fd, line.encode() + b"\n")

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def read_events(directory: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], int]:
    """Every event of every `*.jsonl` file in `directory`, with the file's name as
    `src`, and how many lines could not be read (a line cut by a SIGKILL)."""
    events: list[dict[str, Any]] = []
    torn = 0
    for path in sorted(pathlib.Path(directory).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                torn += 1
                continue
            if isinstance(event, dict) and "e" in event:
                event["src"] = path.name
                events.append(event)
            else:
                torn += 1
    return events, torn


class _EventClock(logging.Filter):
    """Stamps each log record with the events' clock (`time.monotonic()`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.t = time.monotonic()
        return True


def log_lines(handler: logging.Handler, level: int = logging.WARNING) -> None:
    """Send the root logger's records of `level` and above to `handler`, each line
    starting with the events' clock (`t=...`), so a log line can be placed among the
    events of every process of the run."""
    handler.addFilter(_EventClock())
    handler.setFormatter(logging.Formatter("t=%(t).3f %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
