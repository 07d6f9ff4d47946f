#!/usr/bin/env bash
# The device checks issue #31 still needs, as one call of about nine minutes on one GPU, most important first
# (each step has its own time limit and writes its JSON as it goes, so a step cut short keeps what it measured).
#
#   1. where a decode step's time goes now: the one-token forward with transformers' SDPA attention against the
#      decode step's own decode_attention (grouped-query heads, never timed on a GPU), eager and as a CUDA graph,
#      with a kernel profile of each at 1,024 rows; the sampler fp64 vs fp32; the device correctness checks;
#   2. eager (dynamic) vs captured at 64, 256 and 1,024 rows, the trainer's fp32 weights under autocast and a bf16
#      copy, 128 new tokens (the goal: at 256 rows at least 4x faster than eager, at most 8 ms a step);
#   3. the compiled step at 256 rows (bf16 weights), never timed on a GPU;
#   4. one full trainer step with the captured decode (rlcurate dryrun), for the planner's decode rate.
#
# The device machine has no network and no ../shared: copy the Qwen tokenizer and GSM8K (21 MB) into .devdata/
# (ignored by git) and carry it, then run, from this machine:
#   mkdir -p .devdata && cp -r ../shared/data/{qwen2.5-tokenizer,gsm8k} .devdata/
#   device run: command "bash bench/gpu_next.sh", carry [".devdata"], timeout_s 590; the JSONs come back from $OUT
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
  timeout "$limit" "$@"
  echo "== $name: exit $? after $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
}

step parts 120 $PY bench/bench_decode_parts.py --device $DEV --arch $ARCH --rows $ROWS --context $CTX \
    --correctness-rows $CHECK --profile --out "$OUT/decode_parts_gpu.json"
step captured 240 $PY bench/bench_decode_cache.py --device $DEV --arch $ARCH --rows $ROWS \
    --weights fp32-autocast bf16 --modes dynamic captured --new-tokens $TOKENS --repeats $REPEATS \
    --threads $THREADS --out "$OUT/decode_captured_gpu.json"
step compiled 120 $PY bench/bench_decode_cache.py --device $DEV --arch $ARCH --rows $ROWS_MID \
    --weights bf16 --modes dynamic compiled --new-tokens $TOKENS --repeats $REPEATS --threads $THREADS \
    --out "$OUT/decode_compiled_gpu.json"
if [ -z "${RLCURATE_GPU_NEXT_REHEARSAL:-}" ]; then FULL="--full --set eval_prompts=64"; else FULL="--layers 2 --device cpu"; fi
step trainer 100 $PY -m rlcurate.cli dryrun --config configs/gpu_grpo_qwen25_05b_gsm8k.yaml $FULL \
    --set decode=captured --json "$OUT/dryrun_captured_gpu.json"
