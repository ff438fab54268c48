"""Sum exp1's end-to-end figures over several per-dataset runs (each run's results.csv, one dataset each).

    python3 combine.py movie=cold-movie/results.csv ecommerce=cold-ecommerce/offline-prefill/results.csv ...

Prints, per dataset and for all of them together, per target: gold plan's execution (s), `global-as-run`'s total
over it, LOTUS's total over `global-as-run`'s, and how many `global-as-run` plans met both targets against gold.
"""
import collections
import csv
import sys

TARGETS = ['0.5', '0.7', '0.9']


def load(path, dataset=None):
    """Per target, the gold plan's execution summed over the queries of `dataset` (every dataset where `None`) in
    `path`; per (method, target), the summed totals, the plans meeting both targets against gold, and the plans."""
    gold = {}
    tot = collections.defaultdict(float)
    met = collections.Counter()
    n = collections.Counter()
    for r in csv.DictReader(open(path)):
        if dataset is not None and r['dataset'] != dataset:
            continue
        t, m = r['target'], r['method']
        gold[(r['dataset'], r['query'], t)] = float(r['gold_cost_seconds'])
        if r['total_seconds']:
            tot[(m, t)] += float(r['total_seconds'])
        n[(m, t)] += 1
        if float(r['precision']) >= float(t) and float(r['recall']) >= float(t):
            met[(m, t)] += 1
    g = collections.defaultdict(float)
    for (_, _, t), v in gold.items():
        g[t] += v
    return g, tot, met, n


def row(name, g, tot, met, n):
    cells = [name]
    for t in TARGETS:
        gar, lotus = tot[('global-as-run', t)], tot[('lotus', t)]
        cells.append(
            f"{g[t]:.1f} s: {gar / g[t]:.3f}, LOTUS/Stretto {lotus / gar:.2f}, met {met[('global-as-run', t)]}/{n[('global-as-run', t)]}"
        )
    return '| ' + ' | '.join(cells) + ' |'


def main():
    print('| dataset | ' + ' | '.join(f'target {t}: gold exec, global-as-run total / gold exec' for t in TARGETS) + ' |')
    print('|---' * (len(TARGETS) + 1) + '|')
    all_g, all_tot = collections.defaultdict(float), collections.defaultdict(float)
    all_met, all_n = collections.Counter(), collections.Counter()
    for arg in sys.argv[1:]:
        dataset, path = arg.split('=', 1)
        g, tot, met, n = load(path, dataset)
        print(row(dataset, g, tot, met, n))
        for k, v in g.items():
            all_g[k] += v
        for k, v in tot.items():
            all_tot[k] += v
        all_met.update(met)
        all_n.update(n)
    print(row('**all**', all_g, all_tot, all_met, all_n))


if __name__ == '__main__':
    main()
