#!/usr/bin/env bash
# One GPU lease, several calls (bench/device.md): each call runs one step and packs what it has under $OUT.
#   bash bench/device-session.sh build [SHAPE...]            # wheels, llama-server with CUDA (about 300 s); the
#                                                            # synthetic GGUFs named are written meanwhile;
#                                                            # LLAMA_CMAKE_ARGS adds cmake options (a short
#                                                            # lease: -DGGML_CUDA_FA=OFF builds in less time);
#                                                            # the build comes back as $OUT/llama-cuda-bin.tar.xz.part*
#                                                            # and SOURCE: copied to .dev/llama-cuda-bin and carried,
#                                                            # a later lease's build step unpacks it instead
#   bash bench/device-session.sh tune SHAPE VRAM [NAME]      # crashline tune of that GGUF (--ctx 32768 --prompt
#                                                            # 16000) into /tmp/res/NAME (default SHAPE), its wall
#                                                            # time in tune-wall.jsonl; stopped after TUNE_LIMIT_S
#                                                            # (560) and resumed by the same step
#   bash bench/device-session.sh check NAME                  # bench/resent_check.py run + analyse on that tune
#                                                            # (run stopped after CHECK_LIMIT_S, default 900;
#                                                            # CHECK_ARGS adds run's options, e.g. --resent-too)
#   bash bench/device-session.sh context NAME                # crashline context --finalists on that tune's results
#                                                            # (stopped after CONTEXT_LIMIT_S, default 560)
#   bash bench/device-session.sh bandwidth [RUNS]            # bench/bandwidth_spread.py --runs RUNS (default 3):
#                                                            # the host's memory bandwidth in fresh processes
#                                                            # (BANDWIDTH_METHODS: its --methods, e.g. now,half)
#   bash bench/device-session.sh grid NAME                   # bench/answer_grid.py run on that tune's results
#   bash bench/device-session.sh resume DIR                  # copy an earlier lease's NAME folder (DIR, from the
#                                                            # repository) to /tmp/res/NAME, for its grid
#   bash bench/device-session.sh measure CONFIG MODEL ID...  # fetch/inspect the config's models and provision once,
#                                                            # then measure each configuration id of MODEL, aggregate;
#                                                            # MEASURE_STARTS=K: starts 2..K of each, interleaved
#   bash bench/device-session.sh soak ID...                  # measure with bench/configs/h200-draft-soak.yaml
#   bash bench/device-session.sh all ID...                   # build, then soak (one call)
#   bash bench/device-session.sh gputest ARGS...             # pytest -m gpu ARGS (e.g. tests/test_gpu_live.py -k aim)
#   bash bench/device-session.sh order SHAPE ARGS...         # bench/warmup_bias.py order on that synthetic GGUF
#   bash bench/device-session.sh depth SHAPE SETTINGS ARGS...  # bench/depth_check.py on that synthetic GGUF, into
#                                                            # /tmp/res/depth-SHAPE (ARGS: --depths, --starts, ...)
#   bash bench/device-session.sh sampler ARGS...             # bench/sampler_overhead.py on the synthetic 30B-A3B
#                                                            # (written first), ARGS after --
# The results stay under /tmp/res between calls; every call packs them into $OUT/results.tgz.
set -euo pipefail
export CRASHLINE_CACHE=/tmp/clc PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1
export LLAMA_SERVER=${LLAMA_SERVER:-/tmp/llama/build/bin/llama-server}
step=$1; shift
# Synthetic shapes by name: the overrides of a preset (crashline.config.shape). qwen3moe-40x192 is issue #22's
# 20 GB qwen3moe (40 layers, 192 experts / 8, n_embd 2048, Q4_0).
shape_of() {
  case $1 in
    qwen3-30b-a3b) echo '{} qwen3-30b-a3b' ;;
    qwen3moe-40x192) echo '{"layers": 40, "n_expert": 192} qwen3-30b-a3b' ;;
    # issue #40's seed scale: about 41 GB, 48 layers, 320 experts / 8, n_embd 2048, Q4_0, ctx 262144 in its header
    seed) echo '{"n_expert": 320, "ctx": 262144} qwen3-30b-a3b' ;;
    # issue #43's GPU runs: 8 of the 30B-A3B shape's layers (2.6 GiB, starts in seconds) and a draft of its
    # vocabulary (1 layer, 8 experts, 31 MiB)
    s8) echo '{"layers": 8, "ctx": 131072} qwen3-30b-a3b' ;;
    draft8) echo '{"layers": 1, "n_expert": 8, "ctx": 131072} qwen3-30b-a3b' ;;
    # issue #40's partial placement, a second shape: 16 of the 30B-A3B shape's layers (5.3 GiB)
    s16) echo '{"layers": 16, "ctx": 131072} qwen3-30b-a3b' ;;
    tiny-moe) echo '{} tiny-moe' ;;  # to try the steps on a machine without a GPU (VRAM -)
    *) echo "unknown shape $1" >&2; exit 2 ;;
  esac
}
write_model() {
  local spec; spec=$(shape_of "$1")
  mkdir -p /tmp/clc/models
  [ -e /tmp/clc/models/$1.gguf ] || python -c "
import json, sys; from pathlib import Path; from crashline.models import synthetic as s
s.write_moe_gguf(Path(sys.argv[1]), s.resolve_shape(json.loads(sys.argv[2]), sys.argv[3]))" \
    /tmp/clc/models/$1.gguf "${spec% *}" "${spec##* }"
}
if [ "$step" = all ]; then bash "$0" build && bash "$0" soak "$@"; exit; fi
if [ "$step" = soak ]; then bash "$0" measure bench/configs/h200-draft-soak.yaml tiny-moe "$@"; exit; fi
case $step in
build)
  # the wheels crashline and Snakemake need beyond the machine's own packages (bench/device.md)
  python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    2>&1 | tail -2
  started=$(date +%s)
  for shape in "$@"; do write_model "$shape" > /tmp/write-$shape.log 2>&1 & done
  mkdir -p /tmp/llama/build/bin
  if ls .dev/llama-cuda-bin/llama-cuda-bin.tar.xz.part* > /dev/null 2>&1; then
    # an earlier lease's build of the same sources, carried (.dev/llama-cuda-bin): no build here (about 290 s saved);
    # its RUNPATH is /tmp/llama/build/bin, where it was built
    cat .dev/llama-cuda-bin/llama-cuda-bin.tar.xz.part* | xz -d | tar xf - -C /tmp/llama/build/bin
    echo "carried build: $(cat .dev/llama-cuda-bin/SOURCE)" > /tmp/build.log
    /tmp/llama/build/bin/llama-server --version >> /tmp/build.log 2>&1
  else
    tar xzf .dev/llama-src-min.tar.gz -C /tmp/llama
    cmake -S /tmp/llama -B /tmp/llama/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF ${LLAMA_CMAKE_ARGS:-} > /tmp/build.log 2>&1
    # llama-perplexity for the KV types' KL divergence (crashline.jobs.kvquality), found beside llama-server;
    # LLAMA_TARGETS=llama-server leaves it out
    cmake --build /tmp/llama/build --target ${LLAMA_TARGETS:-llama-server llama-perplexity} -j16 >> /tmp/build.log 2>&1
    # the binaries back to this machine, for the next lease to carry instead of building: xz in parts of 15 MiB
    # (a file coming back holds at most 16 MiB; three parts at most, beside results.tgz); kept in .dev/llama-cuda-bin
    (cd /tmp/llama/build/bin && tar cf - llama-* lib*.so*) | xz -T0 -6 > /tmp/llama-cuda-bin.tar.xz
    if [ "$(stat -c %s /tmp/llama-cuda-bin.tar.xz)" -le $((45 << 20)) ]; then
      split -b 15M -d /tmp/llama-cuda-bin.tar.xz "$OUT/llama-cuda-bin.tar.xz.part"
      sha256sum .dev/llama-src-min.tar.gz | cut -c1-64 > "$OUT/SOURCE"
    fi
    ls -l /tmp/llama-cuda-bin.tar.xz >> /tmp/build.log
  fi
  tail -3 /tmp/build.log
  wait
  echo "build and models: $(( $(date +%s) - started )) s"; ls -l /tmp/clc/models 2>/dev/null || true
  mkdir -p /tmp/res && cp /tmp/build.log /tmp/res/ && cat /tmp/write-*.log 2>/dev/null | tail -5
  ;;
resume)
  name=$(basename "$1") pack=$(basename "$1")
  mkdir -p /tmp/res && rm -rf /tmp/res/$name && cp -r "$1" /tmp/res/$name
  # the model file was written again on this machine (the same bytes, a new mtime): its fetch record takes the new
  # mtime once the file's sha256 is the recorded one, else measure refuses it as replaced (lease of session 13)
  python - /tmp/res/$name <<'PY'
import json, os, sys
from pathlib import Path
from crashline.models.verify import sha256_file
for record in Path(sys.argv[1]).glob("**/models/*/fetch.json"):
    fetch = json.loads(record.read_text())
    for f in fetch["files"]:
        path = Path(f["path"])
        if not path.exists() or os.stat(path).st_mtime_ns == f.get("mtime_ns"):
            continue
        if sha256_file(path) != f["sha256"]:
            sys.exit(f"{path}: not the file {record} recorded (sha256 differs)")
        f["mtime_ns"] = os.stat(path).st_mtime_ns
    record.write_text(json.dumps(fetch, indent=2))
PY
  ;;
tune)
  shape=$1 name=${3:-$1} vram=--vram=$2 pack=${3:-$1}; [ "$2" = - ] && vram=
  mkdir -p /tmp/res/$name
  begun=$(date +%s.%N)
  # SIGTERM short of the call's limit: tune stops its jobs at a safe point, and the same step again resumes
  # TUNE_ARGS: the question (default --ctx 32768 --prompt 16000), e.g. '--ctx 131072 --prompt 100000 --time 15m'
  timeout -k 20 "${TUNE_LIMIT_S:-560}" python -m crashline tune /tmp/clc/models/$shape.gguf ${TUNE_ARGS:---ctx 32768 --prompt 16000} $vram \
    --out /tmp/res/$name/tune >> /tmp/res/$name/tune-console.txt 2>&1 && rc=0 || rc=$?
  python -c "import json, sys; print(json.dumps({'begun': float(sys.argv[1]), 'ended': float(sys.argv[2]), 'rc': int(sys.argv[3])}))" \
    "$begun" "$(date +%s.%N)" "$rc" >> /tmp/res/$name/tune-wall.jsonl
  tail -25 /tmp/res/$name/tune-console.txt
  step_rc=$rc
  ;;
check)
  name=$1 pack=$1
  timeout -k 20 "${CHECK_LIMIT_S:-900}" python bench/resent_check.py run /tmp/res/$name/tune/tune.yaml --out /tmp/res/$name/check ${CHECK_ARGS:-} \
    >> /tmp/res/$name/check-console.txt 2>&1 && step_rc=0 || step_rc=$?
  python bench/resent_check.py analyse /tmp/res/$name/tune/tune.yaml /tmp/res/$name/check > /dev/null 2>&1 || true
  tail -5 /tmp/res/$name/check-console.txt
  ;;
context)
  name=$1 pack=$1
  timeout -k 20 "${CONTEXT_LIMIT_S:-560}" python -m crashline context /tmp/res/$name/tune/results --finalists \
    --out /tmp/res/$name/context >> /tmp/res/$name/context-console.txt 2>&1 && step_rc=0 || step_rc=$?
  tail -12 /tmp/res/$name/context-console.txt
  ;;
bandwidth)
  pack=bandwidth
  mkdir -p /tmp/res/bandwidth
  python bench/bandwidth_spread.py --runs "${1:-3}" ${BANDWIDTH_METHODS:+--methods $BANDWIDTH_METHODS} > /tmp/res/bandwidth/bandwidth.jsonl 2> /tmp/res/bandwidth/console.txt \
    && step_rc=0 || step_rc=$?
  tail -6 /tmp/res/bandwidth/bandwidth.jsonl
  ;;
grid)
  name=$1 pack=$1
  timeout 560 python bench/answer_grid.py run /tmp/res/$name/tune/tune.yaml --out /tmp/res/$name/grid \
    >> /tmp/res/$name/grid-console.txt 2>&1 && step_rc=0 || step_rc=$?
  grep "^pass" /tmp/res/$name/grid-console.txt | tail -30; tail -3 /tmp/res/$name/grid-console.txt
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
  # MEASURE_STARTS=K: starts 2..K of every id after start 1 of all (interleaved), each only while MEASURE_LIMIT_S
  # (counted from here) still leaves room for the longest start so far
  begun=$(date +%s) longest=0
  for k in $(seq 1 "${MEASURE_STARTS:-1}"); do
    for id in "$@"; do
      if [ $(( ${MEASURE_LIMIT_S:-100000} - ($(date +%s) - begun) )) -le "$longest" ]; then
        echo "start $k of $id left out: MEASURE_LIMIT_S"; continue
      fi
      t=$(date +%s)
      python -m crashline measure --model $model --id $id --start $k --config /tmp/$name.yaml
      t=$(( $(date +%s) - t )); [ "$t" -gt "$longest" ] && longest=$t
    done
  done
  python -m crashline aggregate --config /tmp/$name.yaml || true
  ;;
gputest)
  pack=gpu-test.log
  timeout 300 python -m pytest -m gpu -p no:cacheprovider -s -v "$@" > /tmp/res/gpu-test.log 2>&1 && step_rc=0 || step_rc=$?
  tail -15 /tmp/res/gpu-test.log
  ;;
order)
  shape=$1; shift; pack=order-$shape
  write_model "$shape"
  timeout 560 python bench/warmup_bias.py order --model /tmp/clc/models/$shape.gguf --out /tmp/res/$pack "$@" \
    > /tmp/res/$pack.console.txt 2>&1 && step_rc=0 || step_rc=$?
  mv /tmp/res/$pack.console.txt /tmp/res/$pack/console.txt 2>/dev/null || true
  tail -4 /tmp/res/$pack/console.txt
  ;;
depth)
  shape=$1 settings=$2; shift 2; pack=depth-$shape
  write_model "$shape"
  timeout 900 python bench/depth_check.py --model /tmp/clc/models/$shape.gguf --settings "$settings" \
    --out /tmp/res/$pack "$@" > /tmp/res/$pack.console.txt 2>&1 && step_rc=0 || step_rc=$?
  mv /tmp/res/$pack.console.txt /tmp/res/$pack/console.txt 2>/dev/null || true
  tail -4 /tmp/res/$pack/console.txt
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
# tune and grid pack their shape's folder only: everything at once would pass the 16 MiB a file may bring back
tar czf $OUT/results.tgz -C /tmp/res ${pack:-.} $( [ -n "${pack:-}" ] && cd /tmp/res && ls gpu.txt build.log 2>/dev/null )
exit ${step_rc:-0}  # the step's own status (tune's, the grid's), after its results are packed
