#!/usr/bin/env bash
# What a GPU lease carries (bench/device.md), prepared on this machine: .whl (the wheels crashline and Snakemake
# need that the GPU machine's image lacks, for its Python 3.12) and .dev/llama-src-min.tar.gz (the pinned llama.cpp
# sources a CUDA build of llama-server compiles). Both are ignored by git; run from the repository root:
#   bash bench/device-prep.sh
# It ends by checking that every wheel's Requires-Dist is a wheel here or a package the image has
# (/work/.library/device/KINDS.md): a missing one costs a lease its build.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${LLAMA_SRC:-$HOME/.cache/crashline/llama.cpp/11434.0.0-src}
[ -d "$src" ] || { echo "no llama.cpp sources at $src: run the tests or 'crashline provision' once first" >&2; exit 2; }
w=$(mktemp -d)
platforms="--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any"
pip wheel -q -w "$w" --no-deps connection_pool==0.0.3            # an sdist only
pip download -q --only-binary=:all: --python-version 3.12 $platforms -d "$w" --find-links "$w" \
  snakemake==9.27.1 gguf jsonschema packaging==25.0
# the image has these (KINDS.md); platformdirs it lacks (one lease was lost to that)
for have in numpy pandas tzdata matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing python_dateutil six \
  PyYAML pyyaml Jinja2 jinja2 MarkupSafe markupsafe psutil requests urllib3 idna certifi charset_normalizer tabulate \
  wrapt attrs typing_extensions tqdm; do
  rm -f "$w"/"$have"-*.whl
done
rm -f "$w"/packaging-2[6-9]*.whl                                   # snakemake wants packaging < 26
# pulp carries 35 MB of CBC solvers: without them Snakemake's scheduler falls back to greedy, as crashline runs it
for p in "$w"/PuLP-*.whl "$w"/pulp-*.whl; do
  [ -e "$p" ] || continue
  d=$(mktemp -d); (cd "$d" && python -m zipfile -e "$p" . && rm -rf pulp/solverdir/cbc \
    && sed -i '/solverdir\/cbc/d' ./*.dist-info/RECORD && rm "$p" && python -m zipfile -c "$p" ./*)
  rm -rf "$d"
done
rm -rf .whl && mkdir -p .whl && cp "$w"/*.whl .whl/ && rm -rf "$w"
# the llama.cpp sources without models/, docs/, the web UI's sources and tests, the server's tests and the ggml
# backends a CUDA build does not compile (4.9 MB: the tree and what it carries stay under a call's 64 MiB)
mkdir -p .dev
tar czf .dev/llama-src-min.tar.gz -C "$src" \
  $(for b in hexagon sycl vulkan opencl openvino et metal webgpu cann virtgpu zdnn musa; do echo --exclude=ggml/src/ggml-$b; done) \
  --exclude=tools/ui/src --exclude=tools/ui/tests --exclude=tools/ui/package-lock.json --exclude=tools/mtmd/test-3.mp4 \
  --exclude=tools/server/tests --exclude=tools/server/webui \
  ggml src include common vendor cmake tools app licenses scripts CMakeLists.txt CMakePresets.json LICENSE
python - <<'PY'
import re, zipfile
from pathlib import Path
from packaging.requirements import Requirement
THERE = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
         "os_name": "posix", "platform_machine": "x86_64", "implementation_name": "cpython",
         "platform_python_implementation": "CPython"}
image = set()
for line in Path("/work/.library/device/KINDS.md").read_text().splitlines():
    if line.startswith("nvidia-h100-x1") and "Packages:" in line:
        image = {p.strip().rstrip(".").lower().replace("_", "-") for p in line.split("Packages:")[1].split(",")}
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
wheels = {norm(p.name.split("-")[0]): p for p in Path(".whl").glob("*.whl")}
missing = set()
for name, path in wheels.items():
    meta = next(n for n in zipfile.ZipFile(path).namelist() if n.endswith(".dist-info/METADATA"))
    for line in zipfile.ZipFile(path).read(meta).decode().splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker and not req.marker.evaluate({**THERE, "extra": ""}):
                continue
            dep = norm(req.name)
            if dep not in wheels and dep not in image:
                missing.add(f"{dep} (for {name})")
if not image:
    raise SystemExit("KINDS.md lists no packages of the image: check its format")
if missing:
    raise SystemExit("wheels missing on the GPU machine: " + ", ".join(sorted(missing)))
print(f"{len(wheels)} wheels; every Requires-Dist is a wheel here or in the image")
PY
du -sh .whl .dev/llama-src-min.tar.gz
