#!/usr/bin/env bash
# verl >= 0.9 on visenv: Qwen2.5-VL-3B-Instruct, sokoban and frozenlake, multi-turn with
# images, through the `visenv` agent loop (docs/verl.md). GPU only; not run in this repo's CI.
#
#   docker compose up envs                       # the environments (another shell or host)
#   visenv verl-data --env sokoban --env frozenlake --out data/visenv --max-turns 10 \
#       --format grounding_worldmodeling
#   bash examples/verl/run_qwen2_5_vl_3b.sh grpo  # or: ppo (GAE with a critic)
#
# Extra arguments go to verl as hydra overrides (e.g. trainer.n_gpus_per_node=4).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
estimator=${1:-grpo}
shift || true
model=${MODEL:-Qwen/Qwen2.5-VL-3B-Instruct}
data=${DATA:-$repo/data/visenv}

case "$estimator" in
  grpo) algo=(algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=8
              actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=0.01
              actor_rollout_ref.actor.kl_loss_type=low_var_kl) ;;
  ppo)  algo=(algorithm.adv_estimator=gae actor_rollout_ref.rollout.n=1
              critic.model.path="$model" critic.optim.lr=1e-5
              critic.ppo_micro_batch_size_per_gpu=4 trainer.critic_warmup=0) ;;
  *) echo "usage: $0 grpo|ppo [hydra overrides...]" >&2; exit 2 ;;
esac

cd "$repo"  # clients/ must be importable by verl's workers (or: pip install visenv)
PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" python -m verl.trainer.main_ppo \
  data.train_files="$data/train.parquet" \
  data.val_files="$data/validation.parquet" \
  data.train_batch_size=64 \
  data.max_prompt_length=2048 \
  data.max_response_length=6144 \
  data.return_raw_chat=true \
  data.filter_overlong_prompts=false \
  actor_rollout_ref.model.path="$model" \
  actor_rollout_ref.model.enable_gradient_checkpointing=true \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=32 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.mode=async \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.prompt_length=2048 \
  actor_rollout_ref.rollout.response_length=6144 \
  actor_rollout_ref.rollout.calculate_log_probs=true \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.rollout.agent.default_agent_loop=visenv \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$here/agent_loops.yaml" \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
  "${algo[@]}" \
  trainer.logger='["console"]' \
  trainer.project_name=visenv \
  trainer.experiment_name="qwen2_5_vl_3b_$estimator" \
  trainer.n_gpus_per_node=8 \
  trainer.nnodes=1 \
  trainer.total_epochs=1 \
  trainer.test_freq=10 \
  trainer.save_freq=-1 \
  "$@"
