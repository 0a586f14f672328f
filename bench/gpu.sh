#!/usr/bin/env bash
# One prepared run of the GPU benchmarks, JSON into $OUT; about 7 minutes on one H200, compile
# warm-ups included (each part is cut off by `timeout`; bench.predict rewrites its JSON after
# every part, so a cut-off run keeps what it measured):
#   predict.json         decode ceilings, model alone, end to end with its per-stage profile, cache pass
#   train_compiled.json  the training step alone, fed by the cache loader, fed with device augmentation
# On the device machine: wheels it lacks (pyspng) in .whl/, the WCEBleedGen stills copied to
# .bench_assets/wcebleedgen (../shared does not travel).
# CPU smoke run (tiny model, small sizes; a few minutes on 2 busy cores):
#   STILLS=../shared/fixtures/wcebleedgen/frames SOURCE=tiny COMPILE= FRAMES=600 DECODE_FRAMES=300 BATCH=32 \
#     TRAIN_FRAMES=256 TRAIN_STEPS=3 OUT=/tmp/gpu_smoke bash bench/gpu.sh
set -u
export PYTHONUNBUFFERED=1 CI=1
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
stills=${STILLS:-.bench_assets/wcebleedgen}
out=${OUT:-bench_out}
source=${SOURCE:-random}
compile=${COMPILE---compile}  # COMPILE= (empty) for eager
batch=${BATCH:-256}
workers=${WORKERS:+--workers $WORKERS}
mkdir -p "$out"
{ nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1 || echo "no nvidia-smi"; nproc; } > "$out/gpu.txt"
python3 -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__)" >> "$out/gpu.txt"
timeout ${PREDICT_S:-240} python3 -m bench.predict --stills "$stills" --source "$source" $compile --batch "$batch" $workers \
  --frames ${FRAMES:-20000} --decode-frames ${DECODE_FRAMES:-6000} --decoders opencv pyspng \
  --out "$out/predict.json" > /dev/null 2> "$out/predict.err"
echo "bench.predict exit $?" >> "$out/gpu.txt"
timeout ${TRAIN_S:-200} python3 -m bench.train --stills "$stills" --source "$source" $compile --batch "$batch" $workers \
  --frames ${TRAIN_FRAMES:-8000} --steps ${TRAIN_STEPS:-25} > "$out/train_compiled.json" 2> "$out/train_compiled.err"
echo "bench.train exit $?" >> "$out/gpu.txt"
cat "$out/gpu.txt" "$out"/*.json
for f in "$out"/*.err; do echo "== $f"; tail -n 3 "$f"; done
