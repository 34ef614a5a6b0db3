#!/usr/bin/env bash
# #17 on the two-GPU machine, in two device calls (bench/device.md says how the wheels and the source travel):
#   bash bench/device-multigpu.sh start     # install, build llama-server, the gpu tests, then start the benchmark
#   bash bench/device-multigpu.sh tests     # install, build llama-server, the gpu tests alone
#   bash bench/device-multigpu.sh collect   # wait for the benchmark, pack everything into $OUT/multigpu.tgz
set -u
export CRASHLINE_CACHE=/tmp/clc PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src NCCL_NVLS_ENABLE=0
export LLAMA_SERVER=/tmp/llama/build/bin/llama-server
RES=/tmp/mg
mkdir -p $RES

if [ "$1" = start ] || [ "$1" = tests ]; then
  nvidia-smi > $RES/nvidia-smi.txt 2>&1
  nvidia-smi topo -m > $RES/topo.txt 2>&1
  nproc > $RES/nproc.txt
  python3 -m pip install -q --no-index --find-links .whl snakemake==9.27.1 gguf jsonschema > $RES/pip.log 2>&1 \
    || { tail -5 $RES/pip.log; exit 1; }
  mkdir -p /tmp/llama && tar xzf .dev/llama-src-min.tar.gz -C /tmp/llama
  started=$(date +%s)
  { cmake -S /tmp/llama -B /tmp/llama/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
    && cmake --build /tmp/llama/build --target llama-server -j"$(nproc)"; } > $RES/build.log 2>&1 \
    || { tail -20 $RES/build.log; exit 1; }
  echo "build: $(( $(date +%s) - started )) s"
  python3 -m pytest -m gpu -v -p no:cacheprovider tests/test_gpu_live.py tests/test_gpu_lease.py > $RES/gpu-tests.txt 2>&1
  tail -15 $RES/gpu-tests.txt
  [ "$1" = tests ] && { tar czf $OUT/gpu-tests.tgz --exclude='*.gguf' -C /tmp mg; exit 0; }
  setsid nohup bash -c "for set in gpu mixed; do python3 bench/multigpu.py bench/configs/h200x2-\$set.yaml \
    $LLAMA_SERVER $RES/bench-\$set; done; echo 'all sets done'" > $RES/bench-console.txt 2>&1 < /dev/null &
  echo "benchmark started"
elif [ "$1" = collect ]; then
  for _ in $(seq 1 ${2:-110}); do
    grep -q "all sets done" $RES/bench-console.txt 2>/dev/null && break
    pgrep -f "for set in gpu mixed" > /dev/null || break
    sleep 5
  done
  cat $RES/bench-console.txt
  tar czf $OUT/multigpu.tgz --exclude='*.gguf' -C /tmp mg
fi
