#!/usr/bin/env bash
# Probe (#21, not the product): how much faster is a weight-quantized decoder's question pass than the f32 graph
# Stretto converts, and how far do its logits move? Quantizes a converted decoder with ONNX Runtime's own
# MatMulNBits quantizer (the onnxruntime wheel the catalog pins, plus its Python dependencies from PyPI), then times
# the question pass (40 tokens over a past of 60 or 570 tokens, logits only, 1 thread) of both graphs.
#
#   bash bench/results/quant/probe.sh smollm2-135m 30 3 33 32        # layers, KV heads, '1' and '0' token ids
#   bash bench/results/quant/probe.sh qwen2.5-coder-0.5b 24 2 16 15
#
# Environment: STRETTO_HOME (default ~/.cache/stretto), PROBE_DIR (default /tmp/stretto-quant-probe).
set -euo pipefail
model=$1; layers=$2; heads=$3; yes=$4; no=$5
home=${STRETTO_HOME:-$HOME/.cache/stretto}
dir=${PROBE_DIR:-/tmp/stretto-quant-probe}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir/wheels" "$dir/site"
if [ ! -d "$dir/site/onnxruntime" ]; then
  python3 -m pip download -q --only-binary=:all: -d "$dir/wheels" onnx==1.23.2 onnx_ir==1.1.0 packaging sympy \
    coloredlogs flatbuffers humanfriendly
  for w in "$dir"/wheels/*.whl "$home"/wheels/onnxruntime-1.31.1-*.whl; do python3 -m zipfile -e "$w" "$dir/site"; done
fi
src="$home/models/$model/onnx/decoder.onnx"
for cfg in "4 32 asym" "4 128 sym" "8 128 sym"; do
  set -- $cfg
  out="$dir/$model-q$1-b$2-$3.onnx"
  [ -f "$out" ] || PYTHONPATH="$dir/site" python3 "$here/probe.py" quantize "$src" "$out" "$1" "$2" "$3"
  echo "$model, $1-bit weights, block $2, $3:"
  PYTHONPATH="$dir/site" python3 "$here/probe.py" time "$src" "$out" "$layers" "$heads" "$yes" "$no"
done
