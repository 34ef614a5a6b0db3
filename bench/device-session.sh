#!/usr/bin/env bash
# One GPU lease, several calls (bench/device.md): each call runs one step and packs what it has under $OUT.
#   bash bench/device-session.sh build                       # wheels, llama-server with CUDA (about 300 s)
#   bash bench/device-session.sh measure CONFIG MODEL ID...  # fetch/inspect the config's models and provision once,
#                                                            # then measure each configuration id of MODEL, aggregate
#   bash bench/device-session.sh soak ID...                  # measure with bench/configs/h200-draft-soak.yaml
#   bash bench/device-session.sh all ID...                   # build, then soak (one call)
#   bash bench/device-session.sh sampler ARGS...             # bench/sampler_overhead.py on the synthetic 30B-A3B
#                                                            # (written first), ARGS after --
# The results stay under /tmp/res between calls; every call packs them into $OUT/results.tgz.
set -euo pipefail
export CRASHLINE_CACHE=/tmp/clc PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
step=$1; shift
if [ "$step" = all ]; then bash "$0" build && bash "$0" soak "$@"; exit; fi
if [ "$step" = soak ]; then bash "$0" measure bench/configs/h200-draft-soak.yaml tiny-moe "$@"; exit; fi
case $step in
build)
  python -m pip install -q --no-index --no-deps --find-links .whl gguf jsonschema jsonschema-specifications \
    referencing rpds-py attrs typing_extensions tqdm 2>&1 | tail -2
  mkdir -p /tmp/llama && tar xzf .dev/llama-src-min.tar.gz -C /tmp/llama
  cmake -S /tmp/llama -B /tmp/llama/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF > /tmp/build.log 2>&1
  cmake --build /tmp/llama/build --target llama-server -j16 >> /tmp/build.log 2>&1
  tail -3 /tmp/build.log
  mkdir -p /tmp/res && cp /tmp/build.log /tmp/res/
  ;;
measure)
  config=$1 model=$2; shift 2
  name=$(basename "$config" .yaml)
  out=/tmp/res/$name
  sed -e "s#RESULTS#$out/results#" -e "s#SERVER#/tmp/llama/build/bin/llama-server#" "$config" > /tmp/$name.yaml
  if [ ! -e $out/results/server/provenance.json ]; then
    for m in $(python -c "import sys, yaml; print(*yaml.safe_load(open(sys.argv[1]))['models'])" /tmp/$name.yaml); do
      python -m crashline fetch --model $m --config /tmp/$name.yaml
      python -m crashline inspect --fetch-record $out/results/models/$m/fetch.json \
        --out $out/results/models/$m/manifest.json
    done
    python -m crashline provision --config /tmp/$name.yaml
  fi
  for id in "$@"; do python -m crashline measure --model $model --id $id --config /tmp/$name.yaml; done
  python -m crashline aggregate --config /tmp/$name.yaml || true
  ;;
sampler)
  model=/tmp/clc/models/qwen3-30b-a3b.gguf
  [ -e $model ] || python -c "
import sys; from pathlib import Path; from crashline.models import synthetic as s
s.write_moe_gguf(Path(sys.argv[1]), s.resolve_shape({}, 'qwen3-30b-a3b'))" $model
  LLAMA_SERVER=/tmp/llama/build/bin/llama-server python bench/sampler_overhead.py --model "$model" "$@" \
    > /tmp/res/sampler-console.txt 2>&1 || true
  tail -5 /tmp/res/sampler-console.txt
  ;;
esac
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > /tmp/res/gpu.txt 2>/dev/null || true
tar czf $OUT/results.tgz -C /tmp/res .
