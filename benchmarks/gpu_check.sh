#!/usr/bin/env bash
# The GPU checks, in one command (at most ~14 minutes on one H200: the sum of
# the part limits below; ~8 when each part takes half its limit):
#
#   benchmarks/gpu_check.sh                    # on a CUDA machine
#   benchmarks/gpu_check.sh --device cpu --dry # a smoke run of every piece, any machine
#
# Parts, each under its own time limit (a part that fails or runs out is recorded with
# its exit code and log tail, and the next part still runs):
#   1. doctor       `rldojo doctor` (device, CUDA, backends)
#   2. quickstart   `rldojo train` (the quickstart) on the device, native generation
#   3. quickstart_vllm  the same with generation.backend = "vllm" colocated, when
#                   rldojo has a vLLM policy and vllm imports (else: skipped, and why)
#   4. tokens       generation tokens/s: the native backend (64 prompts x 128 tokens,
#                   greedy off, T=1) and, when vllm imports, vllm.LLM on the same prompts
#   5. async        benchmarks/async_vs_sync.py on the device (lag 0 vs lag 1); with
#                   vllm and Ray importable also async_vllm: vLLM colocated (lag 0) vs
#                   vLLM on a Ray rollout worker sharing the GPU (lag 1)
#   6. vs_trl       benchmarks/vs_trl.py on the device (TRL in vLLM colocate mode when
#                   vllm imports; rldojo's side alone when TRL is not installed), then
#                   the same with --lora
# Writes $OUT_DIR/gpu_check_<device>.json (OUT_DIR: benchmarks/results/gpu_check; with
# --dry a temporary directory, so a smoke run never replaces real figures) with every
# part's exit code, wall time, parsed JSON result and log tail, plus one file per
# benchmark; each with the manifest of benchmarks/results_io.py. Logs and runs: ${TMPDIR:-/tmp}.
# Interpreter: $PYTHON, else .venv/bin/python, else python3 (with rldojo installed, and
# on a GPU machine a CUDA build of torch). Models load offline (HF_HUB_OFFLINE=1).
set -uo pipefail
cd "$(dirname "$0")/.."

ARGS="$*"  # before the loop below shifts them away: the manifests record the command
DEVICE=cuda
DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --dry) DRY=1; shift ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [ "$DRY" = 1 ]; then
  OUT_DIR="${OUT_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_dry.XXXXXX")}"
else
  OUT_DIR="${OUT_DIR:-benchmarks/results/gpu_check}"
fi
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_work.XXXXXX")"  # logs, runs; left for inspection
mkdir -p "$OUT_DIR" "$WORK/logs"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
# For the manifests the two inline Python parts write (benchmarks/results_io.py).
export GPU_CHECK_DRY="$DRY" GPU_CHECK_COMMAND="benchmarks/gpu_check.sh $ARGS"
STARTED=$(date +%s)

# part NAME LIMIT_S RESULT_JSON -- COMMAND...: run it, note rc and seconds for the summary.
part() {
  local name="$1" limit="$2" result="$3"; shift 4
  local t0=$(date +%s)
  echo "== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$WORK/logs/$name.log" 2>&1
  local rc=$?
  echo "$name $rc $(( $(date +%s) - t0 )) $result" >>"$WORK/parts.txt"
  tail -n 3 "$WORK/logs/$name.log"
  echo "-- $name: exit $rc in $(( $(date +%s) - t0 ))s"
}
skip() {  # skip NAME REASON
  echo "$1 skipped 0 - $2" >>"$WORK/parts.txt"
  echo "== $1: skipped ($2)"
}

if [ "$DRY" = 1 ]; then
  TRAIN_SET=(--set model.name=tiny-random --set run.steps=1 --set rollout.prompts_per_step=2
             --set rollout.group_size=4 --set sampling.max_new_tokens=8 --set eval.tasks=4)
  TOKENS_ARGS=(--model tiny-random --prompts 4 --max-new-tokens 8)
  ASYNC_ARGS=(--dry)  # tiny-random, 1 step of 2 x 4 samples of 8 tokens; manifest dry
  VS_TRL_ARGS=(--dry --steps 1)
  LIMITS=(60 120 60 120 180)
else
  TRAIN_SET=()
  TOKENS_ARGS=(--model smollm2-135m-instruct --prompts 64 --max-new-tokens 128)
  ASYNC_ARGS=(--steps 3)
  VS_TRL_ARGS=(--steps 3)
  LIMITS=(40 120 50 100 150)  # per part; vs_trl twice (full, LoRA)
fi
COMMON_SET=(--set run.device="$DEVICE" --set run.output_dir="$WORK/runs" --set run.report_to=[])

has() { "$PY" -c "import $1" >/dev/null 2>&1; }
HAS_VLLM=0; has vllm && HAS_VLLM=1
HAS_TRL=0; has trl && HAS_TRL=1
HAS_VLLM_POLICY=0; has rldojo.policy.vllm_backend && HAS_VLLM_POLICY=1

# 1. doctor
part doctor "${LIMITS[0]}" - -- "$PY" -m rldojo.cli doctor
# 2. quickstart, native generation
part quickstart "${LIMITS[1]}" "$WORK/runs/quickstart/summary.json" -- \
  "$PY" -m rldojo.cli train "${COMMON_SET[@]}" --set run.name=quickstart "${TRAIN_SET[@]}"
# 3. quickstart, vLLM colocated
if [ "$HAS_VLLM_POLICY" = 1 ] && [ "$HAS_VLLM" = 1 ]; then
  part quickstart_vllm "${LIMITS[1]}" "$WORK/runs/quickstart_vllm/summary.json" -- \
    "$PY" -m rldojo.cli train "${COMMON_SET[@]}" --set run.name=quickstart_vllm \
    --set generation.backend=vllm --set loss.entropy_source=trainer "${TRAIN_SET[@]}"
else
  skip quickstart_vllm "rldojo has no vLLM policy yet (rldojo.policy.vllm_backend) or vllm does not import"
fi
# 4. generation tokens/s per backend
part tokens "${LIMITS[2]}" "$OUT_DIR/gpu_tokens_$DEVICE.json" -- "$PY" - "$DEVICE" \
  "$OUT_DIR/gpu_tokens_$DEVICE.json" "$HAS_VLLM" "${TOKENS_ARGS[@]}" <<'PYEOF'
"""Tokens/s of each generation backend on one device, same prompts (arith-v1, T=1)."""
import argparse, json, os, sys, time
import torch
sys.path.insert(0, "benchmarks")
from results_io import write_result
from rldojo.envs.registry import make_env
from rldojo.policy.models import load_model
from rldojo.policy.transformers_backend import TransformersPolicy
from rldojo.types import SamplingParams

device, out, has_vllm = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
p = argparse.ArgumentParser()
p.add_argument("--model"); p.add_argument("--prompts", type=int)
p.add_argument("--max-new-tokens", type=int)
args = p.parse_args(sys.argv[4:])
model, tok = load_model(args.model)
model = model.to(device)
dtype = torch.bfloat16 if device.startswith("cuda") else None
policy = TransformersPolicy(model, tok, generation_dtype=dtype)
env = make_env("arith-v1")
tasks = env.tasks("train", seed=0)[: args.prompts]
prompts = [policy.encode_chat(env.prompt_messages(t)) for t in tasks]
sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0)
policy.generate(prompts[:2], SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))
if device.startswith("cuda"):
    torch.cuda.synchronize()
t0 = time.perf_counter()
done = policy.generate(prompts, sampling)
wall = time.perf_counter() - t0
n = sum(len(c.token_ids) for c in done)
result = {"device": device, "model": args.model, "prompts": len(prompts),
          "max_new_tokens": args.max_new_tokens,
          "native": {"tokens": n, "wall_s": wall, "tokens_per_s": n / wall,
                     "dtype": str(dtype or "float32")}}
if has_vllm and device.startswith("cuda"):
    try:  # vLLM alone (no rldojo backend yet): the figure a vLLM policy would aim at
        import tempfile
        from vllm import LLM, SamplingParams as VSP
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d); tok.save_pretrained(d)
            llm = LLM(model=d, dtype="bfloat16", gpu_memory_utilization=0.3)
            vsp = VSP(max_tokens=args.max_new_tokens, temperature=1.0, seed=0)
            llm.generate([{"prompt_token_ids": q} for q in prompts[:2]], vsp)
            t0 = time.perf_counter()
            outs = llm.generate([{"prompt_token_ids": q} for q in prompts], vsp)
            wall = time.perf_counter() - t0
            n = sum(len(o.outputs[0].token_ids) for o in outs)
            result["vllm"] = {"tokens": n, "wall_s": wall, "tokens_per_s": n / wall}
    except Exception as exc:
        result["vllm"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
else:
    result["vllm"] = {"skipped": "vllm does not import" if not has_vllm else "not on CUDA"}
write_result("gpu_check", f"tokens_{device}", result, path=out,
             dry=os.environ["GPU_CHECK_DRY"] == "1", script="benchmarks/gpu_check.sh",
             command=os.environ["GPU_CHECK_COMMAND"].split())
print(json.dumps({k: v.get("tokens_per_s", v) if isinstance(v, dict) else v
                  for k, v in result.items()}))
PYEOF
# 5. synchronous vs asynchronous training
part async "${LIMITS[3]}" "$OUT_DIR/async_vs_sync_$DEVICE.json" -- "$PY" benchmarks/async_vs_sync.py \
  --device "$DEVICE" --skip-workers --out "$OUT_DIR/async_vs_sync_$DEVICE.json" "${ASYNC_ARGS[@]}"
if [ "$HAS_VLLM" = 1 ] && has ray; then
  part async_vllm "${LIMITS[3]}" "$OUT_DIR/async_vs_sync_vllm_$DEVICE.json" -- "$PY" \
    benchmarks/async_vs_sync.py --device "$DEVICE" --generation vllm \
    --out "$OUT_DIR/async_vs_sync_vllm_$DEVICE.json" "${ASYNC_ARGS[@]}"
else
  skip async_vllm "vllm or ray does not import"
fi
# 6. rldojo vs TRL, full fine-tuning and LoRA
TRL_FLAGS=(--device "$DEVICE")
[ "$HAS_TRL" = 1 ] || TRL_FLAGS+=(--sides rldojo)
[ "$HAS_VLLM" = 1 ] && [ "$DEVICE" != cpu ] && TRL_FLAGS+=(--trl-vllm)
part vs_trl "${LIMITS[4]}" "$OUT_DIR/vs_trl_$DEVICE.json" -- "$PY" benchmarks/vs_trl.py \
  "${TRL_FLAGS[@]}" "${VS_TRL_ARGS[@]}" --out "$OUT_DIR/vs_trl_$DEVICE.json"
part vs_trl_lora "${LIMITS[4]}" "$OUT_DIR/vs_trl_${DEVICE}_lora.json" -- "$PY" benchmarks/vs_trl.py \
  "${TRL_FLAGS[@]}" "${VS_TRL_ARGS[@]}" --lora --out "$OUT_DIR/vs_trl_${DEVICE}_lora.json"

# The summary: every part's exit code, seconds, result JSON and log tail.
SUMMARY="$OUT_DIR/gpu_check_$DEVICE.json"
"$PY" - "$WORK" "$SUMMARY" "$DEVICE" "$DRY" "$(( $(date +%s) - STARTED ))" <<'PYEOF'
import json, os, sys, time
from pathlib import Path
sys.path.insert(0, "benchmarks")
from results_io import write_result
work, summary, device, dry, wall = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
parts = {}
for line in (work / "parts.txt").read_text().splitlines():
    name, rc, seconds, rest = line.split(" ", 3)
    entry = {"exit_code": None if rc == "skipped" else int(rc), "seconds": int(seconds)}
    if rc == "skipped":
        entry["skipped"] = rest[2:]
    else:
        result = Path(rest)
        if rest != "-" and result.exists():
            entry["result"] = json.loads(result.read_text())
        log = work / "logs" / f"{name}.log"
        entry["log_tail"] = log.read_text()[-3000:] if log.exists() else ""
        entry["ok"] = int(rc) == 0
    parts[name] = entry
out = {"device": device, "parts": parts}
write_result("gpu_check", device, out, path=summary, dry=dry == "1", started=time.time() - int(wall),
             script="benchmarks/gpu_check.sh", command=os.environ["GPU_CHECK_COMMAND"].split())
failed = [n for n, p in parts.items() if p.get("exit_code") not in (0, None)]
print(f"gpu_check: {len(parts)} parts in {wall}s, failed: {failed or 'none'}; wrote {summary}")
sys.exit(1 if failed else 0)
PYEOF
