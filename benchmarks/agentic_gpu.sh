#!/usr/bin/env bash
# On one CUDA GPU: the agentic pipelines of examples/agentic_*.toml (demos ->
# SFT -> RL, `benchmarks/agentic_pipeline.py`) with the RL stage given more episodes than
# the 30-minute CPU budget holds, three variants side by side on the one GPU:
#
#   benchmarks/agentic_gpu.sh          # on a CUDA machine (~8 minutes)
#   benchmarks/agentic_gpu.sh --dry    # a smoke run of the same on any machine (tiny-random, CPU;
#                                      # tests/test_agentic_gpu_dry.py; results in OUT_DIR only)
#
# Variants (each its own process, `run.threads` 4, all on cuda:0):
#   crm_scaled      crm-v1, the committed recipe; RL 8 prompts x 8 samples a step
#   crm_success_kl  crm-v1, the settings of the README's third full-weight crm recipe
#                   (success-only reward, KL 0.1, T = 0.5, Dr. GRPO advantages, SFT 1
#                   epoch of 8) over the committed recipe, which now has all but the KL
#                   and the SFT schedule (and RL on LoRA adapters); RL 8 x 8 a step
#   ttt_scaled      tictactoe-v1, the committed recipe; RL 16 prompts x 8 samples a step
# Every RL stage stops when RL_MINUTES (default 4) of steps are spent (`run.max_minutes`),
# then evaluates; periodic evaluations every 10 steps (`eval.every`) pair with SFT's.
# Each pipeline is killed at LIMIT_S (default 480) seconds; what it wrote stays.
# Writes to OUT_DIR (default: a temporary directory): the results JSON of each pipeline
# that finished (as benchmarks/results/agentic_pipeline/<env>_gpu_<variant>.json; a dry
# run's agentic_pipeline/<env>_dry_<variant>.json are written to OUT_DIR alone), one
# <variant>.tgz of its run directories (logs, metrics, evaluations, samples; no
# checkpoints), and device.txt (nvidia-smi, torch). Exits 1 when a pipeline failed.
# Interpreter: $PYTHON, else .venv/bin/python, else python3; rldojo importable
# (PYTHONPATH=src will do).
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
[ "${1:-}" = "--dry" ] && DRY=1
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT_DIR="${OUT_DIR:-$(mktemp -d /tmp/agentic_gpu_out.XXXXXX)}"
WORK="$(mktemp -d /tmp/agentic_gpu_work.XXXXXX)"
RL_MINUTES="${RL_MINUTES:-4}"
LIMIT_S="${LIMIT_S:-480}"
mkdir -p "$OUT_DIR"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

{ nvidia-smi 2>&1 | head -15
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'available', torch.cuda.is_available(), 'transformers', transformers.__version__)"
  lscpu | grep -E 'Model name|^CPU\(s\)'; } >"$OUT_DIR/device.txt" 2>&1
cat "$OUT_DIR/device.txt"

if [ "$DRY" = 1 ]; then
  KIND=dry; RESULTS_DIR="$OUT_DIR"; DRY_FLAG=(--dry)  # smoke: no figures in benchmarks/results
  COMMON=(--set model.name=tiny-random --set run.device=cpu --set run.threads=1
          --set run.steps=2 --set eval.every=1 --set eval.tasks=4 --set eval.before_tasks=2
          --set sampling.max_new_tokens=16 --set eval.max_new_tokens=16
          --set sft.batch_size=4 --set sft.run.epochs=1 --set "run.max_minutes=$RL_MINUTES"
          --set "model.lora.layers=[1]")  # tiny-random has 2 layers
  DEMOS_CRM=8; DEMOS_TTT=8; PROMPTS=2; GROUP=2; PROMPTS_TTT=2; STEPS_ARGS=()
else
  KIND=gpu; RESULTS_DIR=benchmarks/results; DRY_FLAG=()
  # The model's safetensors export, once, before three processes would race to write it.
  "$PY" -c "from rldojo.policy.models import smollm2_dir; print(smollm2_dir())" || exit 1
  COMMON=(--set run.device=cuda --set run.threads=4 --set eval.every=10
          --set "run.max_minutes=$RL_MINUTES")
  DEMOS_CRM=64; DEMOS_TTT=128; PROMPTS=8; GROUP=8; PROMPTS_TTT=16
  STEPS_ARGS=(--set run.steps=200)  # run.max_minutes ends the RL stage
fi
CRM=(--set "rollout.prompts_per_step=$PROMPTS" --set "rollout.group_size=$GROUP")
[ "$DRY" = 1 ] || CRM+=(--set eval.tasks=192 --set eval.before_tasks=16)
SUCCESS_KL=(--set sft.run.epochs=1 --set sft.batch_size=8 --set loss.kl_coef=0.1
            --set sampling.temperature=0.5 --set loss.scale_adv_by_std=false
            --set env.kwargs.reward.collateral_penalty=0.0
            --set env.kwargs.reward.false_claim_penalty=0.0
            --set env.kwargs.reward.format_penalty=0.0 --set env.kwargs.reward.error_penalty=0.0)
TTT=(--set "rollout.prompts_per_step=$PROMPTS_TTT" --set "rollout.group_size=$GROUP"
     --set env.train_tasks=2000)

started=$(date +%s)
pipeline() {  # pipeline VARIANT ENV DEMOS ARGS...
  local variant="$1" env="$2" demos="$3"; shift 3
  timeout --kill-after=10 "$LIMIT_S" "$PY" benchmarks/agentic_pipeline.py --envs "$env" \
    --demos "$demos" --tag "${KIND}_$variant" --results "$RESULTS_DIR" --out "$WORK/$variant" \
    "${DRY_FLAG[@]}" \
    "${COMMON[@]}" "${STEPS_ARGS[@]}" "$@" >"$WORK/$variant.out" 2>&1
  local rc=$?
  [ "$rc" = 0 ] || echo "$variant" >>"$WORK/failed"
  echo "$variant: exit $rc after $(( $(date +%s) - started ))s; $(tail -n 1 "$WORK/$variant.out")"
}
pipeline crm_scaled crm-v1 "$DEMOS_CRM" "${CRM[@]}" &
pipeline crm_success_kl crm-v1 "$DEMOS_CRM" "${CRM[@]}" "${SUCCESS_KL[@]}" &
pipeline ttt_scaled tictactoe-v1 "$DEMOS_TTT" "${TTT[@]}" &
wait

for variant in crm_scaled crm_success_kl ttt_scaled; do
  [ "$DRY" = 1 ] || cp "$RESULTS_DIR"/agentic_pipeline/*_"${KIND}_$variant".json "$OUT_DIR"/ 2>/dev/null
  cp "$WORK/$variant.out" "$WORK/$variant/" 2>/dev/null
  tar -C "$WORK" --exclude=checkpoints -czf "$OUT_DIR/$variant.tgz" "$variant"
  if [ "$(stat -c %s "$OUT_DIR/$variant.tgz")" -gt 15000000 ]; then  # the ledger is large
    tar -C "$WORK" --exclude=checkpoints --exclude=ledger.sqlite -czf "$OUT_DIR/$variant.tgz" "$variant"
  fi
done
ls -la "$OUT_DIR"
echo "agentic_gpu: done in $(( $(date +%s) - started ))s -> $OUT_DIR"
failed="$(cat "$WORK/failed" 2>/dev/null | tr '\n' ' ')"
rm -rf "$WORK"  # checkpoints included; the .tgz files hold the rest
if [ -n "$failed" ]; then
  echo "agentic_gpu: failed: ${failed}(see each .tgz's <variant>.out)"
  exit 1
fi
