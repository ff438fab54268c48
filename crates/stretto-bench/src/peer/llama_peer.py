"""llama.cpp's side of `stretto bench peer`: per item, the filter question asked (a) with the whole prompt from
scratch, as a LOTUS-style engine pays, and (b) over the item's saved state (llama.cpp's own prefix cache).

Reads one JSON object on stdin: {"model": GGUF path, "threads": n, "yes": "1", "no": "0",
"items": [{"prefix": text, "question": text}, ...]}; prints one JSON list, one object per item, on stdout.
Each figure is one run, in milliseconds. The answer is the log-odds of `yes` over `no` at the last position.
"""

import json
import sys
import time

from llama_cpp import Llama


def main():
    job = json.load(sys.stdin)
    threads = int(job["threads"])
    vocab = Llama(model_path=job["model"], vocab_only=True, verbose=False)

    def tokens(text):
        return vocab.tokenize(text.encode("utf-8"), add_bos=False, special=True)

    items = [(tokens(it["prefix"]), tokens(it["question"])) for it in job["items"]]
    yes = vocab.tokenize(job["yes"].encode("utf-8"), add_bos=False, special=False)[0]
    no = vocab.tokenize(job["no"].encode("utf-8"), add_bos=False, special=False)[0]
    longest = max(len(p) + len(q) for p, q in items)
    # The context just fits the longest item, so a saved state is no larger than it must be.
    llm = Llama(
        model_path=job["model"],
        n_ctx=longest + 16,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=False,
        verbose=False,
    )

    def answer():
        scores = llm.scores[llm.n_tokens - 1]
        return float(scores[yes] - scores[no])

    # One untimed pass first: the first evaluation pays one-off set-up that no item should carry.
    llm.reset()
    llm.eval(items[0][0] + items[0][1])

    out = []
    for prefix, question in items:
        llm.reset()
        start = time.perf_counter()
        llm.eval(prefix + question)
        full_ms = (time.perf_counter() - start) * 1e3
        full_answer = answer()

        llm.reset()
        start = time.perf_counter()
        llm.eval(prefix)
        prefill_ms = (time.perf_counter() - start) * 1e3
        state = llm.save_state()
        llm.reset()
        start = time.perf_counter()
        llm.load_state(state)
        llm.eval(question)
        state_ms = (time.perf_counter() - start) * 1e3
        out.append(
            {
                "prefix_tokens": len(prefix),
                "question_tokens": len(question),
                "full_ms": full_ms,
                "prefill_ms": prefill_ms,
                "state_ms": state_ms,
                "full_answer": full_answer,
                "state_answer": answer(),
            }
        )
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
