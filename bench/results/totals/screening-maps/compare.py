"""Sums global-as-run's and LOTUS's end-to-end totals over exp1 per target for each folder given (an exp1/results.csv
or exp1-results.csv in it), and with two folders lists the global-as-run rows whose total moved by more than 0.5 s."""
import csv,sys
import os
def load(d):
    f=d+'/exp1/results.csv'
    if not os.path.exists(f): f=d+'/exp1-results.csv'
    rows=list(csv.DictReader(open(f)))
    out={}
    for r in rows:
        out[(r['dataset'],r['query'],r['method'],r['target'])]=r
    return out
ds=[load(d) for d in sys.argv[1:]]
for t in ['0.5','0.7','0.9']:
    line=[]
    for d in ds:
        T=sum(float(r['total_seconds']) for k,r in d.items() if k[2]=='global-as-run' and k[3]==t)
        G=sum(float(r['gold_cost_seconds']) for k,r in d.items() if k[2]=='global-as-run' and k[3]==t)
        L=sum(float(r['total_seconds']) for k,r in d.items() if k[2]=='lotus' and k[3]==t)
        met=sum(1 for k,r in d.items() if k[2]=='global-as-run' and k[3]==t and float(r['precision'])>=float(t) and float(r['recall'])>=float(t))
        n=sum(1 for k,r in d.items() if k[2]=='global-as-run' and k[3]==t)
        line.append(f"total {T:8.1f} gold {G:8.1f} ratio {T/G:.4f} lotus/stretto {L/T:.3f} met {met}/{n}")
    print(t,' | '.join(line))
if len(ds)==2:
    a,b=ds
    for k in a:
        if k[2]!='global-as-run': continue
        x=float(a[k]['total_seconds']); y=float(b[k]['total_seconds'])
        if abs(x-y)>0.5: print(f"  {k[0]:9} {k[3]} {x:7.1f} -> {y:7.1f}  {k[1][:70]}")
