"""A sample: a matchmaking lobby on the embedded default (one process).

- `Lobby` is a SpotWide Spot: its handlers and its timer never overlap, so its state
  needs no locks.
- `Player` Actors live in the Entry Spot, each behind its own gate. A player asks the
  lobby for a match with a request and `await`s it (keeping its own turn).
- Rating a pair is slow work: the lobby hands it to a CPU worker with `yield_()`, which
  releases the lobby's gate so other players keep queueing meanwhile. Afterwards the
  lobby re-reads its state and tells the waiting player with a one-way send.
- A timer ticks every 20 ms while players wait.

Run it with `.venv/bin/python samples/matchmaking.py`.
"""

from __future__ import annotations

import threading
import time

import msgspec

import zlink_actors as z


class Play(msgspec.Struct, frozen=True):
    skill: int


class Enqueue(msgspec.Struct, frozen=True):
    player: str
    skill: int


class Queued(msgspec.Struct, frozen=True):
    position: int


class Matched(msgspec.Struct, frozen=True):
    opponent: str
    fairness: float


class Report(msgspec.Struct, frozen=True):
    pass


class Transcript(msgspec.Struct, frozen=True):
    pass


def rate(a: int, b: int) -> float:
    """Stands for expensive scoring; runs on a CPU worker, off the lobby's gate."""
    sum(i * i for i in range(50_000))
    return round(1.0 - abs(a - b) / 100.0, 2)


#: Set by the lobby's timer; the demo waits for it so the transcript is the same each run.
first_tick = threading.Event()


class Lobby(z.Spot):
    def __init__(self) -> None:
        super().__init__()
        self.waiting: list[Enqueue] = []
        self.lines: list[str] = []

    @z.handler
    async def enqueue(self, ctx: z.SpotContext, msg: Enqueue) -> Queued | Matched:
        if not self.waiting:
            self.waiting.append(msg)
            self.lines.append(f"lobby: {msg.player} waits for an opponent")
            ctx.timers.start("waiting", 0.02, self.on_tick)
            return Queued(position=1)
        other = self.waiting.pop(0)
        ctx.timers.cancel("waiting")
        self.lines.append(f"lobby: rating {other.player} vs {msg.player} (gate released)")
        fairness = await ctx.run_cpu_worker(rate, other.skill, msg.skill).yield_()
        # After yield_() the turn is new: anything read before may have changed.
        self.lines.append(f"lobby: {other.player} vs {msg.player}, fairness {fairness}")
        await ctx.send_to_actor(other.player, Matched(msg.player, fairness)).submit()
        return Matched(other.player, fairness)

    @z.handler
    def transcript(self, ctx: z.SpotContext, msg: Transcript) -> list[str]:
        return self.lines

    def on_tick(self, ctx: z.SpotContext, tick: z.TimerTick) -> None:
        # A timer tick is a record under the lobby's gate: it never overlaps a handler.
        if tick.delivery_index == 1 and self.waiting:
            self.lines.append(f"lobby: timer: {self.waiting[0].player} is still waiting")
            first_tick.set()


class Player(z.Actor):
    def __init__(self) -> None:
        super().__init__()
        self.match: Matched | None = None

    @z.handler
    async def play(self, ctx: z.ActorContext, msg: Play) -> str:
        answer = await ctx.request_to_spot("lobby", Enqueue(ctx.actor_id, msg.skill)).submit()
        if isinstance(answer, Matched):
            self.match = answer
            return f"{ctx.actor_id}: matched at once with {answer.opponent}"
        return f"{ctx.actor_id}: queued at position {answer.position}"

    @z.handler
    def matched(self, ctx: z.ActorContext, msg: Matched) -> None:
        self.match = msg

    @z.handler
    def report(self, ctx: z.ActorContext, msg: Report) -> str:
        assert self.match is not None
        return f"{ctx.actor_id} plays {self.match.opponent} (fairness {self.match.fairness})"


def main() -> None:
    started = time.perf_counter()
    with z.Host(spots=[Lobby], actors=[Player]) as host:
        host.spots.get_or_create("lobby", Lobby).submit_sync()
        players = {"ana": 40, "bo": 55, "cy": 70, "di": 72}
        for name in players:
            host.actors.get_or_create(name, Player).submit_sync()
        for name, skill in players.items():
            print(host.request_to_actor(name, Play(skill), reply=str).submit_sync())
            if name == "ana" and not first_tick.wait(5):
                raise SystemExit("the lobby's timer never ticked")
        for line in host.request_to_spot("lobby", Transcript(), reply=list).submit_sync():
            print(line)
        for name in players:
            print(host.request_to_actor(name, Report(), reply=str).submit_sync())
        stats = host.statistics()
        print(f"turns run: {stats.pool.turns}, handler failures: {stats.handler_failures}")
    outcome = host.shutdown().outcome.value  # idempotent: the result of the `with` exit
    print(f"host {host.state.value} ({outcome}) in {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
