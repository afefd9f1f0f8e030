#!/usr/bin/env bash
# Multi-process PPO on CPU: two torchrun processes train the tiny Qwen2.5-VL against one
# local env server, over gloo, either replicated (DDP, which averages gradients) or
# sharded (FSDP2 `fully_shard`: one unit per decoder layer / vision block; actor, critic
# and the frozen reference are sharded). On GPUs the same command with
# --nproc_per_node <GPUs> and run.device=cuda uses NCCL.
#
#   bash examples/gloo_demo.sh ddp     # from the repository root
#   bash examples/gloo_demo.sh fsdp
set -euo pipefail
PARALLEL=${1:-ddp}
case "$PARALLEL" in ddp|fsdp) ;; *) echo "usage: $0 [ddp|fsdp]" >&2; exit 2 ;; esac
PY=${PY:-.venv/bin/python}
HTTP_PORT=${HTTP_PORT:-50170}
GRPC_PORT=${GRPC_PORT:-50171}
OUT=${OUT:-runs/$PARALLEL-gloo-demo}

"$PY" -m visenv_cli serve --host 127.0.0.1 --port "$HTTP_PORT" --grpc-port "$GRPC_PORT" \
    --workers 1 --envs sokoban &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
    "$PY" -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:$HTTP_PORT/health').status_code != 200)" \
        2>/dev/null && break
    sleep 0.5
done

rm -rf "$OUT"
"$PY" -m torch.distributed.run --standalone --nproc_per_node 2 -m trainer.cli \
    examples/train_sokoban_tiny.yaml "run.parallel=$PARALLEL" \
    "env.servers=['127.0.0.1:$GRPC_PORT']" env.max_turns=2 ppo.iterations=2 \
    ppo.episodes_per_iteration=4 ppo.minibatch_size=1 generation.max_new_tokens=8 \
    ppo.entropy_coef=0.01 ppo.kl_coef=0.01 run.progress=false "run.out_dir=$OUT" --verbose
echo "metrics:"; cat "$OUT/metrics.jsonl"
"$PY" - "$OUT" <<'PY'
import sys, torch
ckpt = sorted(__import__("pathlib").Path(sys.argv[1], "checkpoints").glob("iter-*.pt"))[-1]
state = torch.load(ckpt, map_location="cpu", weights_only=False)["actor"]
print(f"{ckpt.name}: {len(state)} full tensors, "
      f"{sum(t.numel() for t in state.values())} values (unsharded, written by rank 0)")
PY
