"""The main sample: chat rooms on the embedded default (one process, no server).

- `Room` is a SpotWide Spot. Its members' handlers share its gate, so players write the
  room's history directly (`ctx.spot`), with no locks and no message round trip.
- `Player` Actors start in the Entry Spot and move into a room with
  `ctx.join_spot(room).defer()`: the move happens after the handler returns; the room
  approves it in `on_actor_join`; the player hears the outcome in `on_join_completed`.
  Messages sent to the player meanwhile wait, in order.
- Shouting is slow work: a player hands it to a CPU worker with `yield_()`, which releases
  the room's gate until the worker is done (re-read room state afterwards).
- Every room subscribes to announcements; one `publish()` reaches all of them.
- A room's timer posts a line on its first tick.

`publish()` completes when the multicast commits, before every room has handled it; the
sample waits on a semaphore the rooms release, so the transcript is the same each run.

Run it with `make demo`.
"""

from __future__ import annotations

import threading
import time

import msgspec

import zlink_actors as z


class Enter(msgspec.Struct, frozen=True):
    room: str


class Say(msgspec.Struct, frozen=True):
    text: str


class Shout(msgspec.Struct, frozen=True):
    text: str


class Announcement(msgspec.Struct, frozen=True):
    text: str


class Transcript(msgspec.Struct, frozen=True):
    pass


#: Released by each room's first timer tick and by each announcement it handles.
opened = threading.Semaphore(0)
announced = threading.Semaphore(0)


def shout(text: str) -> str:
    """Stands for slow work; runs on a CPU worker, off the room's gate."""
    sum(i * i for i in range(50_000))
    return text.upper() + "!"


class Room(z.Spot):
    """A chat room. Members append to `history` from their own handlers via `ctx.spot`."""

    def __init__(self) -> None:
        super().__init__()
        self.history: list[str] = []
        self.members: list[str] = []

    def configure(self, cfg: z.SpotConfig) -> None:
        cfg.subscribe("announcements", "all-rooms")

    def on_create(self, ctx: z.SpotContext, request: object) -> str:
        ctx.timers.start("open", 0.02, self.on_tick)
        return f"room {ctx.spot_id} is ready"

    def on_actor_join(self, ctx: z.SpotContext, actor: z.ActorRef) -> bool:
        if actor.actor_id.startswith("bot-"):
            self.history.append(f"* {actor.actor_id} was turned away")
            return False
        self.members.append(actor.actor_id)
        self.history.append(f"* {actor.actor_id} joined")
        return True

    def on_tick(self, ctx: z.SpotContext, tick: z.TimerTick) -> None:
        self.history.append(f"* {ctx.spot_id} is open")
        ctx.timers.cancel("open")
        opened.release()

    @z.handler
    def announcement(self, ctx: z.SpotContext, msg: Announcement) -> None:
        self.history.append(f"[announcement] {msg.text}")
        announced.release()

    @z.handler
    def transcript(self, ctx: z.SpotContext, msg: Transcript) -> list[str]:
        return list(self.history)


class Player(z.Actor):
    def __init__(self) -> None:
        super().__init__()
        self.join: z.JoinResult | None = None

    @z.handler
    def enter(self, ctx: z.ActorContext, msg: Enter) -> str:
        ctx.join_spot(msg.room).defer()  # runs after this handler returns
        return f"{ctx.actor_id} knocks on {msg.room}"

    def on_join_completed(self, ctx: z.ActorContext, result: z.JoinResult) -> None:
        self.join = result  # runs before any message that waited for the move

    @z.handler
    def say(self, ctx: z.ActorContext, msg: Say) -> str:
        room: Room = ctx.spot  # shared gate: no other turn of this room runs now
        room.history.append(f"{ctx.actor_id}: {msg.text}")
        return ctx.spot_id

    @z.handler
    async def shout(self, ctx: z.ActorContext, msg: Shout) -> str:
        loud = await ctx.run_cpu_worker(shout, msg.text).yield_()
        room: Room = ctx.spot  # read again: the gate was released meanwhile
        room.history.append(f"{ctx.actor_id}: {loud}")
        return loud


def main() -> None:
    started = time.perf_counter()
    with z.Host(spots=[Room], actors=[Player]) as host:
        for room in ("lobby", "games"):
            print(host.spots.get_or_create(room, Room).submit_sync().reply)
        for _ in range(2):
            if not opened.acquire(timeout=5):
                raise SystemExit("a room's timer never ticked")
        players = (("ana", "lobby"), ("bo", "lobby"), ("cy", "games"), ("bot-7", "games"))
        for name, room in players:
            host.actors.get_or_create(name, Player).submit_sync()
            print(host.request_to_actor(name, Enter(room), reply=str).submit_sync())
        # Each request below waits for the player's Join: its queue is held until then.
        host.request_to_actor("ana", Say("hi all"), reply=str).submit_sync()
        host.request_to_actor("bo", Shout("hello"), reply=str).submit_sync()
        host.request_to_actor("cy", Say("anyone for chess?"), reply=str).submit_sync()
        try:
            host.request_to_actor("bot-7", Say("buy now"), reply=str).submit_sync()
        except z.InvalidOperationError:
            print("bot-7 cannot speak: it is not in a room")
        news = Announcement("server restarts at 10")
        host.publish("announcements", "all-rooms", news).submit_sync()  # committed
        for _ in range(2):
            if not announced.acquire(timeout=5):
                raise SystemExit("an announcement never arrived")
        for room in ("lobby", "games"):
            print(f"--- {room}")
            for line in host.request_to_spot(room, Transcript(), reply=list).submit_sync():
                print(line)
    outcome = host.shutdown().outcome.value  # idempotent: the result of the `with` exit
    print(f"--- host {host.state.value} ({outcome}) in {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
