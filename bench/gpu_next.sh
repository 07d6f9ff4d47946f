#!/usr/bin/env bash
# What the next GPU session measures first, as one call of about nine minutes, most important first (each
# step has its own time limit and writes its JSON as it goes, so a step cut short keeps what it measured).
# The two calls of 2026-11-26 on an H200 (data/bench/decode_*_h200.json, appendix A1) timed the captured step at
# 64/256/1,024 rows and the compiled one at 256 rows only, and one trainer step of a 0.5B configuration; not yet:
#
#   1. the fused Triton sampler (rlcurate.rollout.fused_sampler, off unless RLCURATE_FUSED_SAMPLER=1, never
#      compiled for a GPU yet): its tests (tests/test_fused_sampler.py), then the sampler's parts at 256 and
#      1,024 rows, fused against the tensor path (the steps below keep the default tensor sampler);
#   2. the compiled step at 64 and 1,024 rows against eager and captured (bf16 weights), 128 new tokens;
#   3. one full trainer step with decode=compiled (rlcurate dryrun), for the planner's compiled rate;
#   4. the captured step of the 1.5B MATH configuration at its 2,048-token length (half its batch, the token
#      budget the planner fits: 262,144), to check the planner's captured rate scaled to a wider, deeper model
#      and a longer context.
# The device machine has no network and no ../shared: copy the Qwen tokenizer, GSM8K and MATH (28 MB) into
# .devdata/ (ignored by git) and carry it. The tracked tree is over the 64 MiB that travels: take data/runs and
# data/tiny out of the index for the call (nothing here reads them) and put them back after. From this machine:
#   mkdir -p .devdata && cp -r ../shared/data/{qwen2.5-tokenizer,gsm8k,math500,math_train_l3to5} .devdata/
#   git rm -r -q --cached data/runs data/tiny && printf '/data/runs/\n/data/tiny/\n' >> .git/info/exclude
#   device run: command "bash bench/gpu_next.sh", carry [".devdata"], timeout_s 590; the JSONs come back from $OUT
#   git reset -q data/runs data/tiny && sed -i '/^\/data\/runs\/$/d;/^\/data\/tiny\/$/d' .git/info/exclude
# Rehearse on a CPU (tiny sizes, wall-clock numbers that mean nothing): RLCURATE_GPU_NEXT_REHEARSAL=1 bash bench/gpu_next.sh
set -u
OUT=${OUT:-/tmp/gpu_next}
mkdir -p "$OUT"
export RLCURATE_DATA_DIR=${RLCURATE_DATA_DIR:-$PWD/.devdata}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
PY=${PY:-python3}
ARCH=Qwen/Qwen2.5-0.5B-Instruct
if [ -n "${RLCURATE_GPU_NEXT_REHEARSAL:-}" ]; then
  DEV=cpu; ROWS="8"; ROWS_MID=8; TOKENS=4; REPEATS=1; CTX=64; CHECK=8; THREADS=2
else
  DEV=cuda; ROWS="64 256 1024"; ROWS_MID=256; TOKENS=128; REPEATS=3; CTX=192; CHECK=64; THREADS=16
fi
nvidia-smi --query-gpu=name,memory.used,memory.total,utilization.gpu --format=csv 2>/dev/null || true

step() {  # step NAME SECONDS COMMAND...: run with a time limit, say how it ended
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout -k 15 "$limit" "$@"  # -k: a trainer finishes its step in progress on SIGTERM; the kill bounds it
  echo "== $name: exit $? after $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
}

step fused 60 $PY -m pytest -q -p no:cacheprovider tests/test_fused_sampler.py
step parts 60 $PY bench/bench_decode_parts.py --device $DEV --arch $ARCH --rows $ROWS_MID ${ROWS##* } \
    --context $CTX --correctness-rows $CHECK --out "$OUT/decode_parts_gpu.json"
step compiled 180 $PY bench/bench_decode_cache.py --device $DEV --arch $ARCH --rows ${ROWS%% *} ${ROWS##* } \
    --weights bf16 --modes dynamic captured compiled --new-tokens $TOKENS --repeats $REPEATS --threads $THREADS \
    --out "$OUT/decode_compiled_gpu.json"
if [ -z "${RLCURATE_GPU_NEXT_REHEARSAL:-}" ]; then FULL="--full --set eval_prompts=64"; else FULL="--layers 2 --device cpu"; fi
step trainer 120 $PY -m rlcurate.cli dryrun --config configs/gpu_grpo_qwen25_05b_gsm8k.yaml $FULL \
    --set decode=compiled --json "$OUT/dryrun_compiled_gpu.json"
if [ -z "${RLCURATE_GPU_NEXT_REHEARSAL:-}" ]; then FULL="--full --set eval_prompts=8 --set prompts_per_step=32"
else FULL="--layers 1 --device cpu --set eval_prompts=2 --set prompts_per_step=2"; fi  # a CPU takes minutes at 32
step math 120 $PY -m rlcurate.cli dryrun --config configs/gpu_e2e_qwen25_math_15b.yaml $FULL \
    --set decode=captured --set gen_token_budget=262144 \
    --json "$OUT/dryrun_math15b_captured_gpu.json"
