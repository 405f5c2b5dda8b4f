"""`python -m tests.chaos [--seed N] [--minutes M] [--faults a,b,...] [--log-dir DIR]`:
the chaos run (`make chaos`); prints its seed, its figures and every rule it broke, and
exits 1 on any violation (docs/testing.md, "The chaos run")."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import pathlib
import random
import signal
import sys

from .events import log_lines
from .run import FAULTS, ChaosConfig, interrupts_as_keyboard, partition_unavailable, run_chaos


def _faults(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in FAULTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown fault(s) {unknown or text!r}; choose from {', '.join(FAULTS)}"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=None, help="the faults' seed (random)")
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of faults (10)")
    parser.add_argument(
        "--faults", type=_faults, default=FAULTS, help=f"a comma list of: {', '.join(FAULTS)}"
    )
    parser.add_argument("--rate", type=float, default=80.0, help="calls a second (80)")
    parser.add_argument("--objects", type=int, default=6, help="Spots, and as many Actors (6)")
    parser.add_argument("--log-dir", default=None, help="keep every process's log here")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.rate <= 0 or args.objects <= 0:
        parser.error("--minutes, --rate and --objects must be above 0")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    faults = args.faults
    if "partition" in faults and (why := partition_unavailable()) is not None:
        print(f"chaos: partition skipped: {why}", flush=True)
        faults = tuple(name for name in faults if name != "partition")
        if not faults:
            parser.error("no fault left to inject")
    print(
        f"chaos: seed={seed} minutes={args.minutes:g} faults={','.join(faults)}"
        f" (again: python -m tests.chaos --seed {seed} --minutes {args.minutes:g}"
        f" --faults {','.join(faults)})",
        flush=True,
    )
    config = ChaosConfig(
        seed=seed,
        seconds=args.minutes * 60.0,
        faults=faults,
        rate=args.rate,
        objects=args.objects,
        log_dir=args.log_dir,
        say=lambda line: print(line, flush=True),
    )
    if args.log_dir is not None:  # the driver's own log lines go there too
        pathlib.Path(args.log_dir).mkdir(parents=True, exist_ok=True)
        log_lines(logging.FileHandler(pathlib.Path(args.log_dir) / "driver.log"))
    else:  # one WARNING per lost peer and dropped record would drown the figures
        logging.getLogger("zlink_actors").setLevel(logging.ERROR)
    # A run that does not stop can be asked where each thread is (its test does).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        with interrupts_as_keyboard():
            report = run_chaos(config)
    except KeyboardInterrupt:
        print("chaos: interrupted; everything it started is stopped", flush=True)
        return 130
    print(report.render(), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
