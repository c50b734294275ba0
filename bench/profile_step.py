#!/usr/bin/env python3
"""Where one training step's time goes, from the Chrome traces of LibTorch's profiler.

    bench/profile_step.py [--top N] NAME=TRACE.json [NAME=TRACE.json ...]

Reads traces that build/examples/train_gpt_fsdp --profile and bench/python/*_ddp.py --profile
write (each records step 1 of rank 0 with the same Kineto profiler) and prints, per trace, the
self time of each operator on the thread that ran the step (the time inside it less that of the
operators it called), the largest first, as a share of the step's wall time, with the rest of the
step ("outside any operator": the language's own work, Python's or C++'s, and waits not recorded
as an operator). Side by side: one column per trace, rows the union of each trace's top N.
Standard library only.
"""

import argparse
import collections
import json
import sys


def self_times(path):
    """(wall microseconds of the step, {operator: [self microseconds, calls]}) of the thread with
    the most recorded time."""
    try:
        with open(path) as f:
            trace = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"profile_step.py: cannot read the trace {path}: {e}")
    by_thread = collections.defaultdict(list)
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation"):
            by_thread[(e["pid"], e["tid"])].append((float(e["ts"]), float(e["dur"]), e["name"]))
    if not by_thread:
        sys.exit(f"profile_step.py: {path} records no CPU operators: was it written by --profile?")
    events = max(by_thread.values(), key=lambda evs: sum(d for _, d, _ in evs))
    events.sort(key=lambda x: (x[0], -x[1]))  # a parent before the children it encloses
    totals = collections.defaultdict(lambda: [0.0, 0])
    stack = []  # [end, name, children's time, duration]
    covered = 0.0  # time inside some top-level operator

    def close(until):  # pops the operators that ended by then, charging each its self time
        nonlocal covered
        while stack and stack[-1][0] <= until:
            _end, name, children, dur = stack.pop()
            totals[name][0] += dur - children
            if stack:
                stack[-1][2] += dur
            else:
                covered += dur

    for ts, dur, name in events:
        close(ts)
        totals[name][1] += 1
        stack.append([ts + dur, name, 0.0, dur])
    close(float("inf"))
    start = events[0][0]
    wall = max(ts + dur for ts, dur, _ in events) - start
    totals["(outside any operator)"] = [max(0.0, wall - covered), 0]
    return wall, totals


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--top", type=int, default=12, help="operators per trace (default 12)")
    p.add_argument("traces", nargs="+", metavar="NAME=TRACE.json")
    a = p.parse_args()
    named = []
    for arg in a.traces:
        name, sep, path = arg.partition("=")
        if not sep or not name or not path:
            p.error(f"'{arg}': give each trace as NAME=PATH")
        named.append((name, *self_times(path)))
    rows = []
    for _, _, totals in named:
        for op, _ in sorted(totals.items(), key=lambda kv: -kv[1][0])[:a.top]:
            if op not in rows:
                rows.append(op)
    print("| operator (self time) | " + " | ".join(name for name, _, _ in named) + " |")
    print("| --- |" + " ---: |" * len(named))
    print("| step wall time | " + " | ".join(f"{wall / 1e3:.1f} ms" for _, wall, _ in named) + " |")
    for op in rows:
        cells = []
        for _, wall, totals in named:
            us, calls = totals.get(op, (0.0, 0))
            cells.append(f"{us / 1e3:.1f} ms ({100 * us / wall:.0f} %)" + (f", {calls}x" if calls else ""))
        print(f"| {op} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
