#!/usr/bin/env python3
"""Summarise an A/B of two builds taken in turns by copy_call_turns.py: for every timed call,
each build's median, in how many pairs the second build was lower, and the median of the
paired differences (second - first), µs. Pairs, not medians, are what to read: the machine's
speed moves from process to process.

    python3 benches/python/turns_summary.py DIR [A B]

DIR holds turns-<A><i>.json and turns-<B><i>.json (i = 1, 2, ...: copy_call_turns.py
--label A1 --json DIR/turns-A1.json, ...); A and B default to old and new. figures.sh's `ab`
section writes them as a and b."""

import glob
import json
import os
import re
import statistics
import sys


def main():
    if len(sys.argv) not in (2, 4):
        sys.exit(__doc__)
    folder = sys.argv[1]
    a, b = (sys.argv[2], sys.argv[3]) if len(sys.argv) == 4 else ("old", "new")
    runs = {}
    for path in sorted(glob.glob(os.path.join(folder, "turns-*.json"))):
        with open(path) as f:
            doc = json.load(f)
        runs[doc["label"]] = doc["us_per_call"]
    pairs = sorted({int(m.group(1)) for label in runs for m in [re.fullmatch(r"(?:%s|%s)(\d+)" % (a, b), label)] if m})
    keys = sorted({k for r in runs.values() for k in r})
    for key in keys:
        first = [runs["%s%d" % (a, i)][key] for i in pairs if key in runs.get("%s%d" % (a, i), {}) and key in runs.get("%s%d" % (b, i), {})]
        second = [runs["%s%d" % (b, i)][key] for i in pairs if key in runs.get("%s%d" % (a, i), {}) and key in runs.get("%s%d" % (b, i), {})]
        diffs = [y - x for x, y in zip(first, second)]
        if diffs:
            print("%-18s %s median %.2f  %s median %.2f  %s lower in %d of %d pairs, paired median %+.2f us" % (
                key, a, statistics.median(first), b, statistics.median(second), b,
                sum(d < 0 for d in diffs), len(diffs), statistics.median(diffs)))


if __name__ == "__main__":
    main()
