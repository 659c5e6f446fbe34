#!/usr/bin/env bash
# Issue #25's GPU check on a bare one-GPU machine that has python3 with torch and transformers but
# no Django, TRL or vLLM and no network. Run from the repository root, with the wheels of
# `bench/README.md` ("gpu_step") in .whl/ and SmolLM2's tokenizer files in .smollm2/
# (`python -m bench gpu_step --prepare`):
#   OUT=/some/dir bash bench/gpu_check.sh [gpu_step options, default --steps 3]
# It runs make test-gpu's tests, `python -m bench decode`, then `python -m bench gpu_step`; logs and
# JSON go to $OUT.
# About 5 minutes on an H100 (most of it TRL's HF-generate steps).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false BENCH_THREADS=${BENCH_THREADS:-4}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers, trl; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)" | tee -a "$OUT/gpu.txt"
# The engine imports without Django and vLLM:
python3 -c "import sys, workers.rft.loop; assert 'django' not in sys.modules and 'vllm' not in sys.modules" || exit 1
timeout 150 python3 -m pytest --noconftest -p no:django -o addopts="" -m gpu -q -rs tests/gpu 2>&1 | tee "$OUT/test_gpu.log"
tests=$?
timeout 150 python3 -m bench decode 2>&1 | tee "$OUT/decode.log"
timeout "${STEP_TIMEOUT:-330}" python3 -m bench gpu_step --out "$OUT" "${@:---steps 3}" 2>&1 | tee "$OUT/gpu_step.log"
bench=$?
echo "tests exit $tests, gpu_step exit $bench"
exit $((tests || bench))
