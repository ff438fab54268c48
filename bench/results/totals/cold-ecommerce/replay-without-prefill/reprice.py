"""Reprices the cold run's deferred prefill out of a copy of its memo (see ../README.md).

Usage: python3 reprice.py MEMO_COPY_DIR
Every answer of the 1.5B filter that took over three times the median of its answers (and over 1 s) is set to the
median; the excess removed is printed. Other operators' answers are left as they were.
"""
import json, sys

path = f"{sys.argv[1]}/llm_qwen2.5-coder-1.5b@expected-attention-0.00.jsonl"
lines = [json.loads(l) for l in open(path)]
xs = sorted(d["seconds"] for d in lines)
median = xs[len(xs) // 2]
n, excess = 0, 0.0
for d in lines:
    if d["seconds"] > 3 * median and d["seconds"] > 1:
        excess += d["seconds"] - median
        d["seconds"] = median
        n += 1
open(path, "w").write("".join(json.dumps(d) + "\n" for d in lines))
print(f"{n} answers repriced to the median {median:.3f} s; {excess:.1f} s of excess removed")
