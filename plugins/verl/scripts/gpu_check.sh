#!/usr/bin/env bash
# GPU check of the verl backend: the same end-to-end run as the CPU test, on a
# real rollout engine (vLLM) and CUDA FSDP, so what CPU CI cannot see is seen:
# vLLM's sampling-param whitelist (our sampler's keys), its stop/length
# collapsing (our finish-reason inference), NCCL weight sync, CUDA logprob
# agreement between vLLM and FSDP.
#
# Needs: one CUDA GPU, Python 3.11, and PyPI access for `verl[vllm]==0.9.1`
# (vllm 0.24.0, torch 2.11.0, several GB). No model download: the tiny model is
# built offline. Budget: install 5-8 min, run 2-3 min.
#
# Usage (from the repository root): bash plugins/verl/scripts/gpu_check.sh [OUT_DIR]
# Exit 0 and a line "GPU CHECK PASSED" when: rc 0, 3 steps, grad_norm > 0,
# max rollout/trainer prob diff < 1e-2 (bf16/vLLM tolerance, see docs).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
OUT="${1:-${OUT:-/tmp/tracerl-verl-gpu}}"
VENV="${TRACERL_VERL_GPU_VENV:-$ROOT/.venv-verl-gpu}"
mkdir -p "$OUT"
cd "$ROOT"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"

if [[ ! -x "$VENV/bin/python" ]]; then
    python3.11 -m venv "$VENV"
    # the vllm extra pins the CUDA torch that vllm 0.24 is built against
    "$VENV/bin/pip" install --quiet "verl[vllm]==0.9.1" cachetools TransferQueue fastapi uvicorn openai
    "$VENV/bin/pip" install --quiet --no-deps -e . -e plugins/local -e plugins/verl
    "$VENV/bin/pip" install --quiet pluggy httpx starlette tqdm jinja2
fi
"$VENV/bin/python" -c "import verl, vllm, torch; print('verl', verl.__version__, 'vllm', vllm.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee "$OUT/versions.txt"

DATA="$OUT/train.jsonl"
: > "$DATA"
for i in $(seq 0 15); do echo "{\"payload\": {\"mode\": \"two_turn\", \"n\": $i}}" >> "$DATA"; done

export RAY_DEDUP_LOGS=0 WANDB_MODE=disabled HF_HUB_OFFLINE=1
set +e
timeout 900 "$VENV/bin/python" -m core.train backend=verl \
    backend.rollout=vllm backend.n_gpus_per_node=1 backend.agent_workers=2 \
    backend.prompt_length=128 backend.response_length=128 backend.micro_batch_size_per_gpu=16 \
    backend.gpu_memory_utilization=0.3 \
    "backend.overrides=['actor_rollout_ref.rollout.enforce_eager=true']" \
    trainer.batch_size=4 trainer.group_size=4 trainer.max_steps=3 \
    runtime.num_processes=2 task.train_path="$DATA" task.agent=verl_test_agents:app \
    "+task.agent_env.PYTHONPATH=$ROOT/plugins/verl/tests/agents" \
    algorithm.max_tokens=8 algorithm.learning_rate=0.01 run_dir="$OUT/run" > "$OUT/verl.log" 2>&1
RC=$?
set -e
echo "rc=$RC" | tee "$OUT/rc.txt"
"$VENV/bin/python" - "$OUT/verl.log" "$RC" <<'PY'
import re, sys
log = open(sys.argv[1]).read()
rc = int(sys.argv[2])
def metric(name):
    pat = rf"(?<![\w/]){re.escape(name)}:(?:np\.\w+\()?(-?[0-9.]+(?:e[-+]?[0-9]+)?)"
    return [float(m) for m in re.findall(pat, log)]
steps, gn, diff = metric("training/global_step"), metric("actor/grad_norm"), metric("training/rollout_probs_diff_max")
print("steps", steps, "grad_norm", gn, "probs_diff_max", diff, "turns", metric("num_turns/mean"))
ok = rc == 0 and steps == [1.0, 2.0, 3.0] and gn and max(gn) > 0 and diff and max(diff) < 1e-2
print("GPU CHECK PASSED" if ok else "GPU CHECK FAILED")
sys.exit(0 if ok else 1)
PY
