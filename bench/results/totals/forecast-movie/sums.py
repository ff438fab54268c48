import csv,sys,collections
path=sys.argv[1]; ds=sys.argv[2] if len(sys.argv)>2 else None
rows=[r for r in csv.DictReader(open(path)) if ds is None or r['dataset']==ds]
gold={}
tot=collections.defaultdict(float); met=collections.Counter(); n=collections.Counter()
for r in rows:
    t=r['target']; m=r['method']
    key=(r['dataset'],r['query'],t)
    gold[key]=float(r['gold_cost_seconds'])
    if r['total_seconds']:
        tot[(m,t)]+=float(r['total_seconds'])
    n[(m,t)]+=1
    if float(r['precision'])>=float(t) and float(r['recall'])>=float(t): met[(m,t)]+=1
for t in ['0.5','0.7','0.9']:
    g=sum(v for k,v in gold.items() if k[2]==t)
    line=[f"t={t} gold_exec={g:.1f}"]
    for m in ['global','global-as-run','lotus','abacus']:
        if n[(m,t)]: line.append(f"{m}: tot/gold={tot[(m,t)]/g:.3f} met={met[(m,t)]}/{n[(m,t)]}")
    if tot[('global-as-run',t)]: line.append(f"lotus/gar={tot[('lotus',t)]/tot[('global-as-run',t)]:.2f}")
    print(' | '.join(line))
