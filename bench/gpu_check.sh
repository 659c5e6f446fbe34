#!/usr/bin/env bash
# Issues #25 and #43's GPU check, one call, on a bare one-GPU machine that has python3 with torch and
# transformers but no Django, TRL or vLLM and no network. Run from the repository root, with the
# wheels of `bench/README.md` ("gpu_step") in .whl/ and SmolLM2's tokenizer files in .smollm2/
# (`python -m bench gpu_step --prepare`; both ignored by git, so name them in the call's carry):
#   OUT=/some/dir bash bench/gpu_check.sh
# It runs make test-gpu's tests; `bench decode` for SmolLM2-135M (16 x 8 x 256, its step plain and
# compiled by inductor) and for one 1.5-1.7B model (BIG, default qwen2.5-1.5b; BIG=smollm2-1.7b in
# a second call) at the reference shape, 16 x 8 x 1,024, compiled (the engine's default on CUDA),
# with the engine's own attention and one timed call; then `gpu_step` against TRL: SmolLM2-135M at
# 16 x 8 x 256 (3 steps a child, as issue #25's figures; its step compiled, from inductor's disk
# cache that decode filled) and BIG at 4 prompts x 8 x 1,024 tokens in micro-batches of 16 rows
# with activation checkpointing on both sides (2 steps a child, the first dropped: one timed step;
# TRL's HF generate of 1,024 tokens is what takes the time; rftweb's step uncompiled there, as its
# compile at another row count would take a minute of the call). Each model is built once, by the
# first part that needs it, and reused (bench/gpu_step.py's MODELS). Logs and JSON go to $OUT. Written
# for at most 10 minutes (the timeouts add up to 585 s) and not yet run on a GPU (none was lent
# while it was written): each part has its own timeout, so a slow part costs its figures, not the
# rest.
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
timeout 100 python3 -m pytest --noconftest -p no:django -o addopts="" -m gpu -q -rs tests/gpu 2>&1 | tee "$OUT/test_gpu.log"
tests=$?
BIG=${BIG:-qwen2.5-1.5b}
timeout 100 python3 -m bench decode --model smollm2-135m --tokens 256 --attentions gqa_eager --reps 2 \
  2>&1 | tee "$OUT/decode-smollm2-135m.log"
timeout 120 python3 -m bench decode --model "$BIG" --attentions gqa_eager --compile on --reps 1 \
  2>&1 | tee "$OUT/decode-$BIG.log"
bench=0
timeout 100 python3 -m bench gpu_step --out "$OUT/smollm2-135m" --model smollm2-135m --tokens 256 --steps 3 \
  --sides rftweb trl 2>&1 | tee "$OUT/gpu_step-smollm2-135m.log" || bench=1
RFTWEB_COMPILE_DECODE=0 timeout 150 python3 -m bench gpu_step --out "$OUT/$BIG" --model "$BIG" --tasks 4 \
  --tokens 1024 --micro 16 --checkpointing --steps 2 --sides rftweb trl 2>&1 | tee "$OUT/gpu_step-$BIG.log" || bench=1
echo "tests exit $tests, gpu_step exit $bench"
exit $((tests || bench))
