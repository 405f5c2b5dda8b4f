"""`python -m benchmarks [--quick] [--only N]`: every scenario, with ratios and the budget."""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys

from . import (
    global_objects,
    handler_to_handler,
    http,
    latency,
    location,
    mesh,
    oneway,
    pipelined,
    spots10k,
    transports,
)
from ._harness import Machine, Scenario, report, run, run_shared


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--quick", action="store_true", help="short run, same output shape")
    parser.add_argument("--only", type=int, action="append", help="scenario number(s)")
    parser.add_argument("--repetitions", type=int, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    reps = args.repetitions or (3 if args.quick else 5)
    groups: dict[int, list[Scenario]] = {
        1: [oneway.scenario(args.quick)],
        2: [latency.scenario(args.quick)],
        3: [pipelined.scenario(args.quick)],
        4: handler_to_handler.scenarios(args.quick),
        5: [spots10k.scenario(args.quick)],
        6: http.scenarios(args.quick),
        7: [location.scenario(args.quick)],
        8: transports.scenarios(args.quick),
        9: mesh.scenarios(args.quick),
        10: global_objects.scenarios(args.quick),
    }
    print(
        f"python {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} CPU(s); {reps} repetitions after a warm-up, alternating cases; "
        "medians [min .. max]"
    )
    checks = []
    try:
        for number, scenarios in groups.items():
            if args.only and number not in args.only:
                continue
            machine = Machine()
            # 9a and 9b share one mesh run per repetition.
            results = (
                run_shared(scenarios, reps)
                if number == 9
                else (run(scenario, reps) for scenario in scenarios)
            )
            for result in results:
                lines, found = report(result)
                print("\n".join(lines), flush=True)
                checks.extend(found)
            if number == 7:
                print(f"   {location.app_thread_note(args.quick)}", flush=True)
            if number == 9:  # mesh against Ray, with a Ray instance of its own
                lines, found = mesh.versus_ray(args.quick, reps)
                print("\n".join(lines), flush=True)
                checks.extend(found)
            note = machine.line()
            if note:
                print(note, flush=True)
    finally:
        http.SERVER.close()  # the HTTP scenario's server process
        mesh.SERVER.close()  # the mesh scenario's serving node
        global_objects.CLUSTER.close()  # scenario 10's Redis, Object Servers and client
    missed = [c for c in checks if not c[3]]
    print()
    print(f"budget: {len(checks) - len(missed)} of {len(checks)} targets met")
    for name, ratio, target, _ in missed:
        print(f"   MISSED {name}: {ratio:.2f}x (target {target}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
