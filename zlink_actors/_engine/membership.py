"""Membership moves: what runs after a handler deferred a Join or a Leave (digest §3-4).

`defer()` only registers the move; it runs after the handler that registered it ends
normally (an exception discards it). From that moment until the move is decided, the
Actor's queue claim is held, so its next records wait and keep their order. The target
Spot approves in `on_actor_join` (a lifecycle record under its gate); on approval the
Actor's mailbox moves under the Spot's gate (SpotWide) or a gate of its own (PerActor,
Entry). Either way the Actor then hears `on_join_completed(ctx, JoinResult)`, as a
lifecycle record that runs before its queued messages. The Spot it left (by a Leave, a
Join elsewhere or its close) hears `on_actor_leave(ctx, ActorRef)` in its own turn.
"""

from __future__ import annotations

import logging

from .._core.completion import Completion
from .._core.errors import InvalidOperationError, NotFoundError
from .._core.gate import Gate
from .._core.mailbox import Mailbox
from .._core.pool import ADMITTED
from .._core.record import Job
from .kernel import Runtime
from .lifecycle import maybe_await, tell_left
from .objects import Actor, ActorRef, InstanceSpot, JoinResult, ObjectKind, Spot
from .registry import Activation

__all__ = ["start_move"]

log = logging.getLogger("zlink_actors")


def _remote_join(spot_id: str, found: Completion[str | None]) -> JoinResult:
    owner = found._cell._value if found._cell._exc is None else None
    if found._cell._exc is not None:
        return JoinResult(spot_id, False, found._cell._exc)
    if owner is None:
        return JoinResult(spot_id, False, NotFoundError(f"no Spot {spot_id!r}"))
    return JoinResult(
        spot_id,
        False,
        InvalidOperationError(
            f"Spot {spot_id!r} is on node {owner!r}: a Join to a Spot on another node would "
            "move the Actor there, which this version does not do"
        ),
    )


def start_move(runtime: Runtime, act: Activation, spot_id: str | None) -> None:
    """Post-turn work of a handler that deferred a Join (or a Leave: `spot_id` None)."""
    pool = runtime.pool
    engine = runtime.engine
    pool.claim(act.box)  # its next records wait, in order, until the move is decided
    target = engine.entry if spot_id is None else engine.spots.get(spot_id)
    wanted = engine.entry.id if spot_id is None else spot_id
    if target is None or target.closed:
        objects = runtime.objects
        if objects is None or spot_id is None:
            _finish(runtime, act, JoinResult(wanted, False, NotFoundError(f"no Spot {wanted!r}")))
            return
        # Global objects: the Spot may live on another node. A Join there would move the
        # Actor across nodes, which is not supported (docs/mesh.md "Global objects").
        objects.owner_of(ObjectKind.SPOT, wanted)._add_inline(
            lambda found: _finish(runtime, act, _remote_join(wanted, found))
        )
        return
    if (target is engine.entry and spot_id is not None) or issubclass(
        target.type.cls, InstanceSpot
    ):
        error = InvalidOperationError(f"Spot {wanted!r} cannot take Actors")
        _finish(runtime, act, JoinResult(wanted, False, error))
        return
    if target is act.spot:
        _finish(runtime, act, JoinResult(wanted, True))
        return
    if target is engine.entry:
        _finish(runtime, act, JoinResult(wanted, _move(runtime, act, target)))
        return
    ref = ActorRef(act.id, act.generation, act.routing_id)

    asked = False

    def ask(inst: Spot, ctx: object) -> object:
        nonlocal asked
        asked = True
        return inst.on_actor_join(ctx, ref)

    def decided(value: object, exc: BaseException | None) -> None:
        approved = exc is None and bool(value)
        if approved and not act.closed and _move(runtime, act, target):
            _finish(runtime, act, JoinResult(wanted, True))
        else:
            if exc is not None and asked:  # not asked: dropped unrun (the Spot closed)
                engine.handler_failures += 1
                log.error("%r on_actor_join raised", target, exc_info=exc)
            _finish(runtime, act, JoinResult(wanted, False, exc))

    if pool.enqueue(target.box, Job(ask, decided), lifecycle=True) != ADMITTED:
        _finish(runtime, act, JoinResult(wanted, False, NotFoundError(f"Spot {wanted!r} closed")))


def _move(runtime: Runtime, act: Activation, target: Activation) -> bool:
    """Make `act` a member of `target`; False if `target` closed or is closing.

    Membership changes under the engine lock, where `close()` checks for members, so a
    Spot never closes with a member and never gains one while closing.
    """
    engine = runtime.engine
    with engine.lock:
        if target.closed or (target.closing is not None and target is not engine.entry):
            return False
        old = act.spot
        left = old.drop_member(act.id)
        act.spot = target
        if target is not engine.entry:  # the Entry Spot keeps no member list
            target.add_member(ActorRef(act.id, act.generation, act.routing_id))
    gate: Gate[Mailbox] = target.box.gate if target.box.gate.spotwide else Gate()
    runtime.pool.move(act.box, gate)
    if left is not None:
        tell_left(runtime, old, left)
    return True


def _finish(runtime: Runtime, act: Activation, result: JoinResult) -> None:
    told_it = False

    def tell(inst: Actor, ctx: object) -> object:
        nonlocal told_it
        told_it = True
        return maybe_await(inst.on_join_completed(ctx, result))

    def told(value: object, exc: BaseException | None) -> None:
        if exc is not None and told_it:  # not told: dropped unrun (the Actor closed)
            runtime.engine.handler_failures += 1
            log.error("%r on_join_completed raised", act, exc_info=exc)

    # Lifecycle first: the outcome runs before the messages that waited for the move.
    runtime.pool.enqueue(act.box, Job(tell, told), lifecycle=True)
    runtime.pool.release_claim(act.box)
