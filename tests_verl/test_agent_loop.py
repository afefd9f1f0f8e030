"""clients/verl_agent_loop.py in verl's own machinery: `visenv verl-data` rows read by
verl's RLHFDataset, repeated as GRPO repeats them, played by verl's AgentLoopWorker
(which instantiates the loop from its agent-loop config) against a real `visenv serve`,
post-processed by verl into a DataProto. Only generation is a stand-in (the tiny
Qwen2.5-VL on CPU, tiny_model.HFServerManager)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import TOKEN, VERL_CONFIG, spawn, wait_ready, worker_config
from hydra import compose, initialize_config_dir
from tiny_model import HFServerManager
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

from clients import EnvClient, SessionOptions
from clients.verl_agent_loop import EpisodeSpec, drop_failed

LOOP = {"max_turns": 3, "max_tokens_per_turn": 24}


def verl_batch(worker: AgentLoopWorker, config, folder, envs=("sokoban", "frozenlake"), n=2):
    """`visenv verl-data`'s training rows through verl's dataset and collate, each row
    repeated n times (interleaved, as verl's trainer does for GRPO)."""
    subprocess.run(
        [sys.executable, "-m", "visenv_cli", "verl-data", *[a for e in envs for a in ("--env", e)],
         "--out", str(folder), "--train-size", "2", "--val-size", "1", "--max-turns", "3"],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    dataset = RLHFDataset(str(folder / "train.parquet"), worker.tokenizer, config.data,
                          worker.processor)  # fmt: skip
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    return batch.repeat(repeat_times=n, interleave=True)


def spans(mask: list[int]) -> list[list[int]]:
    """The [start, end) runs of 1s."""
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append([start, i])
            start = None
    return out


def replay(server, env: str, seed: int, texts: list[str]):
    """A fresh session of the episode stepped with these texts: (observations, rewards)."""
    with EnvClient(server.url, token=TOKEN) as client:
        (reply,) = client.create(SessionOptions(env, seed=seed))
        observations, rewards = [reply.observation.text], []
        for text in texts:
            (reply,) = client.step(reply.session_id, text)
            observations.append(reply.observation.text)
            rewards.append(reply.reward)
        client.close(reply.session_id)
    return observations, rewards


def test_verl_trains_on_visenv_episodes(server, model_path, manager, tmp_path):
    config = worker_config(model_path, tmp_path, servers=[server.url], **LOOP)

    async def main():
        worker = AgentLoopWorker(config, manager)
        batch = verl_batch(worker, config, tmp_path)
        return worker, batch, await worker.generate_sequences(batch)

    worker, batch, out = asyncio.run(main())
    tok = worker.tokenizer
    vision_start = tok.convert_tokens_to_ids("<|vision_start|>")
    assert len(out) == len(batch) == 8 and set(out.non_tensor_batch["visenv_env"]) == {
        "sokoban", "frozenlake"
    }  # fmt: skip
    generated = Counter(tuple(ids) for ids in manager.generations)
    seen: Counter = Counter()
    for i in range(len(out)):
        extra = {k: v[i] for k, v in out.non_tensor_batch.items()}
        assert not extra["visenv_failed"] and extra["visenv_restarts"] == 0
        response = out.batch["responses"][i].tolist()
        mask = out.batch["response_mask"][i].tolist()
        # mask 1 exactly on the generated tokens, turn by turn, as the server manager made them
        assert spans(mask) == [list(s) for s in extra["visenv_turn_spans"]]
        turns = [response[a:b] for a, b in extra["visenv_turn_spans"]]
        seen.update(tuple(t) for t in turns)
        texts = [tok.decode(t, skip_special_tokens=True) for t in turns]
        logprobs = out.batch["rollout_log_probs"][i]
        assert (logprobs[torch.tensor(mask) == 0] == 0).all() and (logprobs[: len(mask)] <= 0).all()
        # the episode played again with the decoded texts: the same observations and rewards
        env, seed = extra["visenv_env"], int(extra["visenv_seed"])
        observations, rewards = replay(server, env, seed, texts)
        assert extra["turn_scores"] == pytest.approx(rewards)
        assert out.batch["rm_scores"][i].sum().item() == pytest.approx(sum(rewards))
        # the mask-0 tokens between turns are the observations that followed
        ends = [b for _, b in extra["visenv_turn_spans"]]
        starts = [a for a, _ in extra["visenv_turn_spans"]][1:]
        for observation, a, b in zip(observations[1:], ends, starts, strict=False):
            shown = tok.decode(response[a:b])
            assert all(piece.strip() in shown for piece in observation.split("<image>"))
            assert response[a:b].count(vision_start) == observation.count("<image>")
        prompt = tok.decode(out.batch["prompts"][i], skip_special_tokens=True)
        assert observations[0].split("<image>")[0].strip() in prompt
        # every image shown, once per <image>, in multi_modal_data and the processor's inputs
        shown_count = sum(o.count("<image>") for o in observations[: len(starts) + 1])
        ids = out.batch["input_ids"][i][out.batch["attention_mask"][i].bool()].tolist()
        grid = extra["multi_modal_inputs"]["image_grid_thw"]  # from multi_modal_data's images
        assert shown_count == ids.count(vision_start) == grid.shape[0] > 0
        assert extra["__num_turns__"] == 1 + (1 + len(starts)) + len(
            turns
        )  # system, user, assistant
    assert seen == generated  # nothing generated is missing, nothing else has mask 1
    # the same seed (verl's repeats) starts from the same first observation: its text and
    # image tokens, and its image's pixels (another seed's differ)
    prompts = out.batch["prompts"]

    def first_image(i: int) -> torch.Tensor:
        inputs = out.non_tensor_batch["multi_modal_inputs"][i]
        return inputs["pixel_values"][: int(inputs["image_grid_thw"][0].prod())]

    for i in range(0, len(out), 2):
        assert torch.equal(prompts[i], prompts[i + 1])
        assert torch.equal(first_image(i), first_image(i + 1))
    assert not torch.equal(first_image(0), first_image(2))
    # time generating and time in the environment, per sample
    for metrics in out.meta_info["metrics"]:
        assert metrics["generate_sequences"] > 0 and metrics["tool_calls"] > 0
        assert metrics["env_restarts"] == 0 and metrics["env_failed"] == 0


class KillingManager(HFServerManager):
    """Kills a server after its `after`-th answer (a server lost mid-episode); `held`: the
    sessions it held then."""

    def __init__(self, path, victim, after: int) -> None:
        super().__init__(path)
        self.victim, self.after = victim, after
        self.held: int | None = None
        self.killing = False  # set before the first await: the loops generate concurrently

    async def generate(self, request_id, **kwargs):
        out = await super().generate(request_id, **kwargs)
        if len(self.generations) >= self.after and not self.killing:
            self.killing = True
            self.held = await asyncio.to_thread(self.victim.sessions)  # alive: it answers
            os.killpg(self.victim.proc.pid, signal.SIGKILL)
            self.victim.proc.wait(timeout=10)
        return out


def test_a_server_killed_mid_episode_restarts_or_flags(model_path, tmp_path):
    victim = spawn("--workers", "1", "--envs", "sokoban,frozenlake")
    spare = spawn("--workers", "1", "--envs", "sokoban,frozenlake")
    try:
        wait_ready(victim), wait_ready(spare)
        manager = KillingManager(model_path, victim, after=3)
        config = worker_config(
            model_path, tmp_path, servers=[victim.url, spare.url], max_restarts=2, **LOOP
        )

        async def main():
            worker = AgentLoopWorker(config, manager)
            return await worker.generate_sequences(verl_batch(worker, config, tmp_path))

        out = asyncio.run(main())  # never raises through verl's gather
        assert victim.proc.poll() is not None, "the victim was not killed mid-episode"
        restarts = out.non_tensor_batch["visenv_restarts"]
        assert not out.non_tensor_batch["visenv_failed"].any()
        # the episodes on the victim played again (the SDK spreads new sessions over both
        # servers); none did if it held none when it died
        assert manager.held is not None
        assert (sum(restarts) > 0) == (manager.held > 0), (manager.held, restarts)
        assert sum(restarts) <= manager.held  # only those (each once, on the spare)
        assert sum(m["env_restarts"] for m in out.meta_info["metrics"]) == sum(restarts)
        for i in np.flatnonzero(restarts):  # played whole on the spare, from the seed
            assert out.batch["response_mask"][i].sum() > 0

        # only the dead server: every episode is flagged, with its reason, and dropped
        config = worker_config(model_path, tmp_path, servers=[victim.url], max_restarts=1, **LOOP)

        async def dead():
            worker = AgentLoopWorker(config, HFServerManager(model_path))
            return await worker.generate_sequences(verl_batch(worker, config, tmp_path))

        out = asyncio.run(dead())
        assert out.non_tensor_batch["visenv_failed"].all()
        assert all("UNAVAILABLE" in e or "SESSION_LOST" in e
                   for e in out.non_tensor_batch["visenv_error"])  # fmt: skip
        assert out.batch["response_mask"].sum() == 0
        assert all(m["env_failed"] == 1 for m in out.meta_info["metrics"])
        assert len(drop_failed(out)) == 0
    finally:
        victim.stop()
        spare.stop()


@pytest.mark.parametrize(
    ("row", "named"),
    [({}, "env"), ({"env": "sokoban", "seed": "3"}, "seed"),
     ({"env": "sokoban", "config": "{oops"}, "config"),
     ({"env": "sokoban", "reasoning": "[1]"}, "reasoning")],
)  # fmt: skip
def test_a_bad_row_is_refused_naming_the_key(row, named):
    with pytest.raises(ValueError, match=named):
        EpisodeSpec.from_row(row)


RECIPE = Path(__file__).resolve().parents[1] / "examples" / "verl"


@pytest.mark.parametrize("estimator", ["grpo", "ppo"])
def test_the_gpu_recipe_is_a_valid_verl_config(estimator, tmp_path):
    """examples/verl/run_qwen2_5_vl_3b.sh (GPU only, not run here) hands verl overrides that
    compose with verl's own trainer config, and its agent-loop file names our loop. The
    script runs for real; only its last command, `python -m verl.trainer.main_ppo`, is
    caught by a `python` on PATH that records its arguments."""
    (tmp_path / "python").write_text('#!/bin/sh\nprintf "%s\\0" "$@" > "$ARGS_OUT"\n')
    (tmp_path / "python").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
        "ARGS_OUT": str(tmp_path / "args"),
    }
    subprocess.run(["bash", str(RECIPE / "run_qwen2_5_vl_3b.sh"), estimator], env=env, check=True)
    args = [a.decode() for a in (tmp_path / "args").read_bytes().split(b"\0")[:-1]]
    assert args[:2] == ["-m", "verl.trainer.main_ppo"]
    with initialize_config_dir(config_dir=str(VERL_CONFIG), version_base=None):
        config = compose("ppo_trainer", overrides=args[2:])
    assert config.algorithm.adv_estimator == {"grpo": "grpo", "ppo": "gae"}[estimator]
    assert config.actor_rollout_ref.rollout.agent.default_agent_loop == "visenv"
    entries = yaml.safe_load(
        Path(config.actor_rollout_ref.rollout.agent.agent_loop_config_path).read_text()
    )
    assert [e["_target_"] for e in entries] == ["clients.verl_agent_loop.VisenvAgentLoop"]
