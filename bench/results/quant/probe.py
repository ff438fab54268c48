"""The quantization probe's two steps (see probe.sh): `quantize SRC DST BITS BLOCK sym|asym` and
`time F32 QUANT LAYERS KV_HEADS YES_ID NO_ID`."""

import sys
import time

import numpy as np


def quantize(src, dst, bits, block, sym):
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(onnx.load(src), bits=bits, block_size=block, is_symmetric=sym, accuracy_level=4)
    q.process()
    onnx.save_model(q.model.model, dst, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=dst.split("/")[-1] + ".data")


def timing(f32, quant, layers, heads, yes, no):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    a, b = ort.InferenceSession(f32, so), ort.InferenceSession(quant, so)
    outs = [o.name for o in a.get_outputs()]

    def run(s, ids, past, plen, want):
        n = len(ids)
        feed = {"input_ids": np.array([ids], dtype=np.int64),
                "attention_mask": np.ones((1, plen + n), dtype=np.int64),
                "position_ids": np.arange(plen, plen + n, dtype=np.int64)[None]}
        for layer in range(layers):
            feed[f"past_key_values.{layer}.key"] = past[2 * layer]
            feed[f"past_key_values.{layer}.value"] = past[2 * layer + 1]
        return s.run(want, feed)

    empty = [np.zeros((1, heads, 0, 64), dtype=np.float32) for _ in range(2 * layers)]
    rng = np.random.default_rng(0)
    for plen in [60, 570]:
        tf = tq = 0.0
        gaps = []
        n = 6
        for it in range(n + 1):
            prefix = [int(t) for t in rng.integers(100, 20000, plen)]
            question = [int(t) for t in rng.integers(100, 20000, 40)]
            d = dict(zip(outs, run(a, prefix, empty, 0, None)))
            past = [d[f"present.{layer}.{kv}"] for layer in range(layers) for kv in ("key", "value")]
            t0 = time.perf_counter()
            la = run(a, question, past, plen, ["logits"])[0].reshape(-1)
            t1 = time.perf_counter()
            lb = run(b, question, past, plen, ["logits"])[0].reshape(-1)
            t2 = time.perf_counter()
            if it == 0:  # warm-up
                continue
            tf += t1 - t0
            tq += t2 - t1
            gaps.append(abs((la[yes] - la[no]) - (lb[yes] - lb[no])))
        print(f"  past {plen}: f32 {1e3 * tf / n:.1f} ms, quantized {1e3 * tq / n:.1f} ms, {tf / tq:.2f}x; "
              f"|change of the yes/no log-odds| mean {np.mean(gaps):.3f}, max {np.max(gaps):.3f}")


if __name__ == "__main__":
    if sys.argv[1] == "quantize":
        quantize(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "sym")
    else:
        timing(sys.argv[2], sys.argv[3], *map(int, sys.argv[4:8]))
