import json, glob, statistics, sys, os
L = sys.argv[1]
a, b = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else ("old", "new")
rows = {}
for f in sorted(glob.glob(os.path.join(L, "turns-*.json"))):
    d = json.load(open(f)); rows[d["label"]] = d["us_per_call"]
keys = sorted({k for r in rows.values() for k in r})
for key in keys:
    old = [rows["%s%d" % (a, i)][key] for i in range(1, 9) if "%s%d" % (a, i) in rows and key in rows["%s%d" % (a, i)]]
    new = [rows["%s%d" % (b, i)][key] for i in range(1, 9) if "%s%d" % (b, i) in rows and key in rows["%s%d" % (b, i)]]
    diffs = [n - o for o, n in zip(old, new)]
    if diffs:
        print("%-18s %s median %.2f  %s median %.2f  %s lower in %d of %d pairs, paired median %+.2f us" % (
            key, a, statistics.median(old), b, statistics.median(new), b, sum(d < 0 for d in diffs), len(diffs), statistics.median(diffs)))
