#!/usr/bin/env bash
# Issues #25 and #43's GPU check, one call, on a bare one-GPU machine that has python3 with torch and
# transformers but no Django, TRL or vLLM and no network. Run from the repository root, with the
# wheels of `bench/README.md` ("gpu_step") in .whl/ and SmolLM2's tokenizer files in .smollm2/
# (`python -m bench gpu_step --prepare`; both ignored by git, so name them in the call's carry):
#   OUT=/some/dir bash bench/gpu_check.sh
# Its parts, in order (PARTS="..." runs some of them: a rerun runs only what did not finish; the
# device lends 15 minutes a session, start-up included, so a whole second run does not fit):
#   tests        make test-gpu's tests (the one-GPU ones; the two-GPU ones skip)
#   decode       `bench decode` for SmolLM2-135M at 16 x 8 x 256, its step plain and compiled by
#                inductor, the engine's own attention
#   decode_big   the same for one 1.5-1.7B model (BIG, default qwen2.5-1.5b; BIG=smollm2-1.7b in
#                another session's call) at the reference shape, 16 x 8 x 1,024, compiled (the
#                engine's default on CUDA), one timed call
#   step         `gpu_step` against TRL, SmolLM2-135M at 16 x 8 x 256 (3 steps a child, as issue
#                #25's figures; its step compiled, from inductor's disk cache that decode filled)
#   step_big     BIG at 4 prompts x 8 x 1,024 tokens in micro-batches of 16 rows with activation
#                checkpointing on both sides (2 steps a child, the first dropped: one timed step;
#                TRL's HF generate of 1,024 tokens is what takes the time; rftweb's step
#                uncompiled there, as its compile at another row count would take a minute)
# and, only when PARTS names it (a call with time to spare):
#   varied       `bench decode --varied` at SmolLM2-135M, 16 x 8 x 256, compiled: answers that end
#                at varied lengths, decoded over every row every step and over the running rows only
# Each model is built once, by the first part that needs it, and reused (bench/gpu_step.py's
# MODELS). Logs and JSON go to $OUT, and $OUT/parts.txt says how each part ended and how long it
# took. Each part has its own timeout (the default five add up to 550 s), so a slow part costs its
# figures, not the rest. Written without a GPU (none was lent while it was written); not yet run on one.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
BIG=${BIG:-qwen2.5-1.5b}
PARTS=${PARTS:-tests decode decode_big step step_big}
tests() {
  timeout 90 python3 -m pytest --noconftest -p no:django -o addopts="" -m gpu -q -rs tests/gpu
}
decode() {
  timeout 90 python3 -m bench decode --model smollm2-135m --tokens 256 --attentions gqa_eager --reps 2
}
decode_big() {
  timeout 120 python3 -m bench decode --model "$BIG" --attentions gqa_eager --compile on --reps 1
}
varied() {
  timeout 100 python3 -m bench decode --model smollm2-135m --tokens 256 --attentions gqa_eager --compile on \
    --reps 1 --varied
}
step() {
  timeout 100 python3 -m bench gpu_step --out "$OUT/smollm2-135m" --model smollm2-135m --tokens 256 --steps 3 \
    --sides rftweb trl
}
step_big() {
  RFTWEB_COMPILE_DECODE=0 timeout 150 python3 -m bench gpu_step --out "$OUT/$BIG" --model "$BIG" --tasks 4 \
    --tokens 1024 --micro 16 --checkpointing --steps 2 --sides rftweb trl
}

for part in $PARTS; do  # each part is the function of its name above
  declare -F "$part" >/dev/null || { echo "unknown part $part in PARTS" >&2; exit 2; }
done

mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false BENCH_THREADS=${BENCH_THREADS:-4}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers, trl; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)" | tee -a "$OUT/gpu.txt"
# The engine imports without Django and vLLM:
python3 -c "import sys, workers.rft.loop; assert 'django' not in sys.modules and 'vllm' not in sys.modules" || exit 1

failed=0
for part in $PARTS; do
  log="$OUT/$part.log"
  [[ $part == *_big ]] && log="$OUT/$part-$BIG.log"
  started=$SECONDS
  "$part" 2>&1 | tee "$log"
  code=${PIPESTATUS[0]}
  echo "$part exit $code in $((SECONDS - started)) s$([[ $code == 124 ]] && echo ' (timed out)')" | tee -a "$OUT/parts.txt"
  ((code)) && failed=1
done
exit $failed
