"""Episodes per second through verl's agent loop (clients/verl_agent_loop.py, 64 loops at
once in one AgentLoopWorker) against the SDK's `run_episodes` (concurrency 64) with the
same tiny random Qwen2.5-VL generating on CPU (tests_verl/tiny_model.HFServerManager, which
batches the requests that arrive together), against one real `visenv serve` over gRPC.
Also: the share of each loop's time spent in the environment, and the server's step calls
per round of 64 turns (1 when every loop's step went in one batch, 64 when none did).

Run from the verl venv (`make verl-setup`), with the main venv serving:

    VISENV_PYTHON=.venv/bin/python .venv-verl/bin/python bench/bench_verl_agent_loop.py
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests_verl")]

from conftest import TOKEN, spawn, wait_ready, worker_config  # noqa: E402
from tiny_model import HFServerManager, build_model_folder  # noqa: E402

from clients import AsyncEnvClient  # noqa: E402
from clients.verl_agent_loop import _SHARED  # noqa: E402

GRPC = re.compile(r"gRPC ([\d.]+:\d+)")


def counters(server) -> dict[str, float]:
    """The server's step calls and applied steps so far (its /metrics)."""
    text = httpx.get(server.url + "/metrics", headers=server.headers, timeout=10).text
    out = {"calls": 0.0, "steps": 0.0}
    for line in text.splitlines():
        if line.startswith("visenv_step_call_seconds_count"):
            out["calls"] += float(line.split()[-1])
        elif line.startswith("visenv_steps_total"):
            out["steps"] += float(line.split()[-1])
    return out


def rows(n: int) -> list[dict]:
    return [{"env": ("sokoban", "frozenlake")[i % 2], "seed": i // 2} for i in range(n)]


async def agent_loop_round(config, manager, n: int):
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto

    worker = AgentLoopWorker(config, manager)
    batch = DataProto(
        non_tensor_batch={
            "extra_info": np.array(rows(n), dtype=object),
            "raw_prompt": np.array([[{"role": "user", "content": "-"}]] * n, dtype=object),
            "agent_name": np.array(["visenv"] * n, dtype=object),
        }
    )
    started = time.perf_counter()
    out = await worker.generate_sequences(batch)
    return out, time.perf_counter() - started, worker


async def sdk_round(grpc: str, manager, processor, n: int, max_turns: int, max_tokens: int):
    async def policy(batch):
        prompts, images = [], []
        for p in batch:
            messages, pil = p.messages(), []
            for m in messages:
                if isinstance(m["content"], list):
                    for part in m["content"]:
                        if part["type"] == "image":
                            part["image"] = part["image"].to_pil()
                            pil.append(part["image"])
            text = processor.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            prompts.append(list(processor(text=[text], images=pil or None)["input_ids"][0]))
            images.append(pil)
        outs = await asyncio.gather(*(
            manager.generate(str(i), prompt_ids=ids, sampling_params={"temperature": 1.0,
                             "max_tokens": max_tokens}, image_data=ims)
            for i, (ids, ims) in enumerate(zip(prompts, images, strict=True))
        ))  # fmt: skip
        return [processor.tokenizer.decode(o.token_ids, skip_special_tokens=True) for o in outs]

    async with AsyncEnvClient(grpc, token=TOKEN) as client:
        started = time.perf_counter()
        trajs = []
        for env in ("sokoban", "frozenlake"):
            trajs += await client.run_episodes(policy, env, range(n // 2), max_turns=max_turns,
                                               concurrency=n, progress=False)  # fmt: skip
        return trajs, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=64)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    server = wait_ready(spawn("--workers", "2", "--envs", "sokoban,frozenlake"))
    try:
        grpc = GRPC.search("".join(server.lines))[1]
        folder = Path(tempfile.mkdtemp(prefix="bench-verl-"))
        path = build_model_folder(folder / "tiny")
        config = worker_config(path, folder, servers=[grpc], max_turns=args.max_turns,
                               max_tokens_per_turn=args.max_tokens)  # fmt: skip
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(path, trust_remote_code=True)
        for r in range(args.rounds):
            manager = HFServerManager(path)
            before = counters(server)
            out, seconds, _ = asyncio.run(agent_loop_round(config, manager, args.loops))
            after = counters(server)
            shared = next(iter(_SHARED.values()))
            calls, steps = after["calls"] - before["calls"], after["steps"] - before["steps"]
            metrics = out.meta_info["metrics"]
            env_s = sum(m["tool_calls"] for m in metrics)
            gen_s = sum(m["generate_sequences"] for m in metrics)
            print(f"round {r} agent loop: {args.loops / seconds:.2f} episodes/s ({seconds:.1f} s, "
                  f"{int(steps)} steps), env share of loop time {env_s / (env_s + gen_s):.1%}, "
                  f"server step calls {int(calls)} = {calls / (steps / args.loops):.2f} per round "
                  f"of {args.loops} turns; loop batcher: {shared.step.calls} step calls for "
                  f"{shared.step.items} steps, {shared.create.calls} create calls for "
                  f"{shared.create.items}; generate batches {manager.batches}")  # fmt: skip
            _SHARED.clear()
            manager = HFServerManager(path)
            before = counters(server)
            trajs, seconds = asyncio.run(sdk_round(grpc, manager, processor, args.loops,
                                                   args.max_turns, args.max_tokens))  # fmt: skip
            after = counters(server)
            calls, steps = after["calls"] - before["calls"], after["steps"] - before["steps"]
            env_s = sum(t.step_seconds for tr in trajs for t in tr.turns)
            pol_s = sum(t.policy_seconds for tr in trajs for t in tr.turns)
            print(f"round {r} run_episodes: {len(trajs) / seconds:.2f} episodes/s "
                  f"({seconds:.1f} s, {int(steps)} steps), env share {env_s / (env_s + pol_s):.1%}, "
                  f"server step calls {int(calls)} = {calls / (steps / (args.loops // 2)):.2f} "
                  f"per round of {args.loops // 2} turns; generate batches {manager.batches}")  # fmt: skip
    finally:
        server.stop()


if __name__ == "__main__":
    main()
