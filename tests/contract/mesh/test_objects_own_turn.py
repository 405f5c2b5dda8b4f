"""Global objects from inside an object's own turn (issue 16): the single-process rules
about an object's own gate still hold when creates and closes go through the Location
Store. A Spot that closes itself from its handler completes at once (`on_closing` runs
after the turn) and its record is deleted once it is removed; a creation hook that asks
to get-or-create its own id is refused with `InvalidOperationError`, not left waiting
for itself."""

from __future__ import annotations

import asyncio

import msgspec

import zlink_actors as z
from zlink_actors.location.keys import authority_key
from zlink_actors.testing import WAIT, HostHarness, wait_until

from ._mesh import mesh_config


class Leave(msgspec.Struct):
    pass


class Hall(z.Spot):
    mode = z.SpotMode.SPOT_WIDE
    type_name = "own-turn.Hall"

    async def on_create(self, ctx: z.SpotContext, request: object) -> str:
        try:
            await ctx.spots.get_or_create(ctx.spot_id, Hall).submit()
        except z.InvalidOperationError as exc:
            return f"refused: {exc}"
        return "joined itself"

    @z.handler
    async def leave(self, ctx: z.SpotContext, msg: Leave) -> bool:
        closed: bool = await ctx.spots.close(ctx.spot_id).submit()
        return closed


def _record(store: z.MemoryLocationStore, spot_id: str) -> object:
    return asyncio.run(store.read(authority_key("spot", spot_id)))


def test_a_spot_closes_itself_and_its_record_goes(harness: HostHarness) -> None:
    store = z.MemoryLocationStore()
    host = harness.host(spots=[Hall], mesh=mesh_config(), location=store)
    made = host.spots.get_or_create("hall", Hall).submit_sync()
    assert isinstance(made, z.Created)
    assert (
        made.reply == "refused: Spot 'hall' is being created by the hook that runs now; "
        "it cannot get or create itself"
    )
    assert isinstance(_record(store, "hall"), z.location.Found)
    closed = host.request_to_spot("hall", Leave(), reply=bool).timeout(WAIT).submit_sync()
    assert closed is True
    assert wait_until(lambda: isinstance(_record(store, "hall"), z.location.Missing))
    assert host.statistics().mesh is not None
    assert wait_until(lambda: host.statistics().mesh.owned_objects == 0)  # type: ignore[union-attr]
    # The id is free again at once.
    again = host.spots.get_or_create("hall", Hall).submit_sync()
    assert isinstance(again, z.Created)
    assert again.ref.generation > made.ref.generation
