"""Sums compare.out per target: LOTUS' seconds on each query's input (cost per profiled tuple x population)."""
import collections, json, sys
agg = collections.defaultdict(lambda: [0.0, 0.0, 0, 0, 0])
for line in open(sys.argv[1] if len(sys.argv) > 1 else "compare.out"):
    head, rest = line.split(" OLD ")
    n, t = head.split()
    old, new = (json.loads(x) for x in rest.split(" NEW "))
    pop = json.load(open(f"bench/results/runs/{n}/profile.json"))["population"]
    a = agg[t]
    a[0] += old["cost_per_tuple"] * pop
    a[1] += new["cost_per_tuple"] * pop
    a[2] += 1
    a[3] += old["precision"] >= float(t) and old["recall"] >= float(t)
    a[4] += new["precision"] >= float(t) and new["recall"] >= float(t)
for t, a in sorted(agg.items()):
    print(f"{t}: old {a[0]:.0f} s, new {a[1]:.0f} s ({a[1] / a[0]:.3f}); targets met on the profile {a[3]} / {a[4]} of {a[2]}")
