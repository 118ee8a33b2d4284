import json, glob, statistics, sys, os
L = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(L, "turns-*.json"))):
    d = json.load(open(f)); rows[d["label"]] = d["us_per_call"]
for key in ("copy_ queued", "copy_ from idle"):
    old = [rows["old%d" % i][key] for i in range(1, 9) if "old%d" % i in rows]
    new = [rows["new%d" % i][key] for i in range(1, 9) if "new%d" % i in rows]
    diffs = [n - o for o, n in zip(old, new)]
    print("%-16s old median %.2f  new median %.2f  new lower in %d of %d pairs, paired median %+.2f us" % (
        key, statistics.median(old), statistics.median(new), sum(d < 0 for d in diffs), len(diffs), statistics.median(diffs)))
