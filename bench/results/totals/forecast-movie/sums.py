"""Per target, the end-to-end totals of exp1's methods over one results.csv (one dataset's rows, or every row).

    python3 sums.py results.csv [DATASET]
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
from combine import TARGETS, load  # noqa: E402

g, tot, met, n = load(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
for t in TARGETS:
    line = [f"t={t} gold_exec={g[t]:.1f}"]
    for m in ['global', 'global-as-run', 'lotus', 'abacus']:
        if n[(m, t)]:
            line.append(f"{m}: tot/gold={tot[(m, t)] / g[t]:.3f} met={met[(m, t)]}/{n[(m, t)]}")
    if tot[('global-as-run', t)]:
        line.append(f"lotus/gar={tot[('lotus', t)] / tot[('global-as-run', t)]:.2f}")
    print(' | '.join(line))
