#!/usr/bin/env bash
# One prepared run of the GPU benchmarks (predict, then train compiled); JSON into $OUT.
# On the device machine: wheels it lacks (pyspng) in .whl/, the WCEBleedGen stills copied to
# .bench_assets/wcebleedgen (../shared does not travel). Locally: STILLS=../shared/fixtures/wcebleedgen/frames.
set -u
export PYTHONUNBUFFERED=1 CI=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
stills=${STILLS:-.bench_assets/wcebleedgen}
out=${OUT:-bench_out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv > "$out/gpu.txt" 2>&1
python3 -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__)" >> "$out/gpu.txt"
timeout ${PREDICT_S:-110} python -m bench.predict --stills "$stills" --compile --frames ${FRAMES:-12000} \
  --decode-frames 6000 --decoders opencv pyspng > "$out/predict.json" 2> "$out/predict.err"
timeout ${TRAIN_S:-80} python -m bench.train --stills "$stills" --compile --frames 8000 --steps 25 \
  > "$out/train_compiled.json" 2> "$out/train_compiled.err"
cat "$out/gpu.txt" "$out"/*.json
for f in "$out"/*.err; do echo "== $f"; tail -n 3 "$f"; done
