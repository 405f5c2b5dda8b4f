"""Cold activation of Instance Spots (digest §3, "Cold activation").

A direct message with instance intent (`send_to_spot(...).activate()`) to a Spot id that
does not exist activates an `InstanceSpot` for it: the factory runs once (activations are
serialised per Host), and the message is the first record the new Spot handles, with
`on_initialize` running at the start of that same turn. Type choice: the explicit type,
else the Host's only InstanceSpot type; several -> `InvalidOperationError` (raised by
the terminator), none -> `NotFoundError`. An id held by a User Spot (or by an Instance
Spot of another type) -> `TypeMismatchError`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._core.completion import Completion, failed
from .._core.errors import (
    InvalidOperationError,
    NotFoundError,
    TypeMismatchError,
    internal_failure,
    shutting_down,
)
from .._core.state import HostState
from .handlers import HandlerInfo
from .kernel import Runtime
from .objects import InstanceSpot, ObjectKind, configure_spot
from .registry import Activation, Attempt

__all__ = ["Admit", "activate_instance"]

#: Admits the message to the (new or found) Spot; returns the call's completion.
Admit = Callable[[Activation, HandlerInfo], Completion[Any]]


def activate_instance(
    runtime: Runtime,
    spot_id: str,
    explicit: type | None,
    payload: object,
    admit: Admit,
    generation: int = 0,
) -> Completion[Any]:
    """Deliver with instance intent to `spot_id`, activating it if it is missing."""
    engine = runtime.engine
    key = (ObjectKind.SPOT, spot_id)
    with engine.activation_lock:
        with engine.lock:
            act = engine.spots.get(spot_id)
            creating = engine.creating.get(key)
        if creating is not None:
            return failed(
                TypeMismatchError(f"Spot {spot_id!r} is being created as a {creating.info.name}")
            )
        if act is not None and not act.closed:
            if not issubclass(act.type.cls, InstanceSpot):
                return failed(
                    TypeMismatchError(f"Spot {spot_id!r} is a {act.type.name}, not an instance")
                )
            if explicit is not None and act.type.cls is not explicit:
                return failed(
                    TypeMismatchError(
                        f"Spot {spot_id!r} is a {act.type.name}, not a {explicit.__qualname__}"
                    )
                )
            info = act.type.table.find(type(payload))
            if info is None:
                return failed(NotFoundError(f"{act.type.name} has no handler for this payload"))
            return admit(act, info)
        if explicit is not None:
            type_info = engine.by_class[explicit]
        else:
            choices = [t for t in engine.types.values() if issubclass(t.cls, InstanceSpot)]
            if not choices:
                return failed(NotFoundError(f"no Spot {spot_id!r} and no InstanceSpot type"))
            if len(choices) > 1:
                names = ", ".join(sorted(t.name for t in choices))
                raise InvalidOperationError(
                    f"several InstanceSpot types are registered ({names}): pass one to activate()"
                )
            type_info = choices[0]
        handler = type_info.table.find(type(payload))
        if handler is None:
            return failed(NotFoundError(f"{type_info.name} has no handler for this payload"))
        with engine.lock:
            if runtime.state is not HostState.SERVING:
                # Shutdown began after the admission check (see `CreateCall._start`).
                return failed(shutting_down())
            # Seen by a concurrent get-or-create of this id: TypeMismatchError there.
            engine.creating[key] = Attempt(
                ObjectKind.SPOT, spot_id, type_info, runtime.pending.cell_lock
            )
        try:
            instance = type_info.cls()
            subscriptions = configure_spot(instance)
        except Exception as exc:
            with engine.lock:
                engine.end_attempt(key)
            return failed(internal_failure(f"{type_info.name}()", exc))
        act = engine.new_spot(spot_id, type_info, instance, generation)
        act.subscriptions = subscriptions
        act.init_pending = True
        # Hold the new Spot's queue until it is registered: its first record is ours.
        runtime.pool.claim(act.box)
        try:
            completion = admit(act, handler)
            engine.make_ready(act, key)
        finally:
            runtime.pool.release_claim(act.box)
        return completion
