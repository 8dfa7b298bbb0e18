#!/usr/bin/env python3
"""Sum Postgres' logged statement durations by statement and protocol step.

Reads a Postgres log written with log_min_duration_statement = 0 (for
instance set on a bench database: ALTER DATABASE d SET
log_min_duration_statement = 0) and prints the statements that took the most
time in total, with their count and mean: where a workload's time goes inside
Postgres when pg_stat_statements is not loaded. Usage:

    scripts/pglog-costs.py LOGFILE [TOP]
"""
import collections
import re
import sys

STAMP = re.compile(r'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d')
DURATION = re.compile(r'duration: ([\d.]+) ms  (parse|bind|execute|statement)[^:]*: ?(.*)')


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    totals = collections.defaultdict(lambda: [0, 0.0])
    current = None

    def flush():
        if current:
            key = (current[1], ' '.join(current[2].split())[:150])
            totals[key][0] += 1
            totals[key][1] += current[0]

    with open(path, errors='replace') as f:
        for line in f:
            line = line.rstrip('\n')
            if STAMP.match(line):
                flush()
                m = DURATION.search(line)
                current = [float(m.group(1)), m.group(2), m.group(3)] if m else None
            elif current is not None and 'DETAIL' not in line and len(current[2]) < 300:
                current[2] += ' ' + line
    flush()
    print(f"{'total ms':>10} {'calls':>7} {'mean µs':>8}  step       statement")
    for (step, stmt), (n, ms) in sorted(totals.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{ms:10.0f} {n:7d} {ms / n * 1000:8.0f}  {step:9s}  {stmt[:110]}")


if __name__ == '__main__':
    main()
