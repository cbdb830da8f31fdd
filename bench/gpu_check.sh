#!/usr/bin/env bash
# The GPU check: one command for a GPU node with no network, at most 8 minutes.
#
#   bench/gpu_check.sh OUT_DIR            # from the repository root
#   ALIGN_GPU_CHECK_SMOKE=1 bench/gpu_check.sh OUT_DIR   # the same parts on CPU at toy sizes (a dry run)
#
# Needs torch (with CUDA) and Triton on the node. The pure-Python packages the image lacks
# (transformers, TRL, datasets, DeepSpeed, Liger, ...) come as wheels in $ALIGN_WHEELS
# (default .whl/; bench/README.md lists them and the command that downloads them); they are
# installed into a scratch folder, never into the node's environment. Writes into OUT_DIR:
#   env.json                 device, driver, versions, whether flash-attn is installed
#   tiny_apertus.json        SFT -> pass -> QRPO of a tiny Apertus on CUDA against CPU
#   preference.json / .md    the preference bench at 1B bf16: align (sdpa masked, FlexAttention,
#                            FlashAttention-2 where installed; whole-layer and MLP-only checkpointing)
#                            against TRL's DPOTrainer (defaults, precomputed reference, Liger), and the
#                            pass (by rows and by a token budget) against TRL's precompute
#   sharded_pass.json        the pass with the model whole and ZeRO-3-partitioned, world size 1
#   gpu_check.json / .md     all of the above in one table (bench/gpu_check_report.py)
# Each part has its own time limit, and a part that fails or runs out of time is reported as such.
set -u
OUT=${1:?usage: bench/gpu_check.sh OUT_DIR}
WHEELS=${ALIGN_WHEELS:-.whl}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  SITE=$(mktemp -d /tmp/align-site.XXXX)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl \
    || { echo "installing the wheels in $WHEELS failed" >&2; exit 1; }
  export PYTHONPATH="$SITE"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error

part() {  # part NAME SECONDS COMMAND...: run with a limit, log to OUT/NAME.log, record the exit status
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  echo "== $name (limit ${limit}s)"
  timeout --signal=TERM --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "{\"part\": \"$name\", \"rc\": $rc, \"seconds\": $((SECONDS - start)), \"limit\": $limit}" >> "$OUT/parts.jsonl"
  tail -n 25 "$OUT/$name.log"
}

if [ "${ALIGN_GPU_CHECK_SMOKE:-0}" = 1 ]; then
  TINY=(--variants cpu cpu); PREF=(--device cpu --size 5m --steps 4 --batch-size 2 --pass-rows 8 --max-len 32)
  SHARD=(--random-llama tiny --rows 4 --tokens 64 --layouts replicate)  # ZeRO-3 inference needs nccl
else
  TINY=(); PREF=(--device cuda --size 1b --steps 14 --batch-size 8 --pass-rows 256 --max-len 1024)
  SHARD=(--random-llama 1b --rows 32 --tokens 512)
fi

: > "$OUT/parts.jsonl"
# the preference bench first: the tiny pipeline's CUDA-vs-CPU check and the sharded pass were measured
# (bench/README.md), and a run cut short should still have the contenders not measured yet
part env 30 "$PY" bench/gpu_check_report.py --env "$OUT/env.json"
part preference 310 "$PY" bench/preference_throughput.py "${PREF[@]}" --contenders gpu --warmup 2 --keep-going \
  --out-json "$OUT/preference.json" --out-md "$OUT/preference.md"
part tiny_apertus 90 "$PY" bench/gpu_tiny_apertus.py --out "$OUT" "${TINY[@]}"
part sharded_pass 50 "$PY" -m torch.distributed.run --nproc_per_node 1 bench/sharded_pass.py "${SHARD[@]}" \
  --json "$OUT/sharded_pass.json"
"$PY" bench/gpu_check_report.py --assemble "$OUT"
