"""Does the trainer learn? FrozenLake on held-out levels, beside simple baselines.

    # all variants, the small model (about 10 minutes)
    nice -n 10 .venv/bin/python examples/learn_frozenlake.py \\
        --json docs/learn_frozenlake.json --plot docs/learn_frozenlake.png
    # natural sentences, a model big enough to read them, every arm (about 45 minutes)
    nice -n 10 .venv/bin/python examples/learn_frozenlake.py --variants natural \\
        --probe-arms bi_level gae turn_wise grpo bi_level+filter --demo-levels 2048 \\
        --warmup-epochs 4 --hidden 128 --layers 4 --warmup-lr 1e-3 --actor-lr 5e-5 \\
        --json docs/learn_frozenlake_natural.json --plot docs/learn_frozenlake_natural.png

    # held-out levels from the learning test's warm-up, PPO with the guards (18 minutes)
    nice -n 10 .venv/bin/python examples/learn_frozenlake.py --variants natural \\
        --arms bi_level --probe-arms bi_level --warm-up tests/trainer/data/frozenlake_warmup \\
        --demo-levels 256 --ppo-iterations 20 --episodes 32 --actor-lr 1e-3 \\
        --max-new-tokens 12 --filter-ratio 0.5 --kl-coef 0.01 --kl-estimator k3 \\
        --kl-mode loss --random-repeats 3 --json docs/learn_frozenlake_heldout.json \\
        --plot docs/learn_frozenlake_heldout.png
    # one move per turn, 6 turns, fewer holes, a blind warm-up (random valid moves);
    # one process per seed on the same held-out levels, then the other estimators from
    # each seed's warm-up, then merged (docs/trainer.md, "Learning demonstration")
    F="--variants natural --max-turns 6 --per-turn 1 --p 0.9 --max-new-tokens 8 \\
       --random-repeats 3 --warm-up-policy random --demo-levels 128 --warmup-epochs 4 \\
       --ppo-iterations 16 --episodes 32 --actor-lr 1e-3 --filter-ratio 0.5 \\
       --kl-coef 0.1 --kl-estimator k3 --kl-mode loss --clip 0.1 --split-seeds 0 1 2"
    for s in 0 1 2; do .venv/bin/python examples/learn_frozenlake.py $F --seeds $s \\
        --probe-arms bi_level --out runs/reactive-$s --json runs/reactive-$s.json & done
    wait
    for s in 0 1 2; do .venv/bin/python examples/learn_frozenlake.py $F --seeds $s \\
        --probe-arms grpo gae turn_wise --warm-up runs/reactive-$s/natural-$s/warm \\
        --out runs/reactive-arms-$s --json runs/reactive-arms-$s.json & done; wait
    .venv/bin/python examples/learn_frozenlake.py --merge runs/reactive-{,arms-}{0,1,2}.json \\
        --json docs/learn_frozenlake_reactive.json --plot docs/learn_frozenlake_reactive.png
    # the same from a warm-up on the oracle's moves stopped after 400 steps (one that
    # leaves room to learn): $F with "--warm-up-policy oracle --demo-levels 512
    # --warmup-steps 400" in place of "--warm-up-policy random --demo-levels 128
    # --warmup-epochs 4" (docs/trainer.md, "from a warm-up stopped early")
    # without the system prompt in the policy's context, from warm-ups on the oracle's
    # moves stopped when they read partly on 100 training-range validation levels
    # (docs/trainer.md, "from warm-ups that read partly"): $F with "--warm-up-policy
    # oracle --no-system-prompt --demo-levels 1024 --validation-levels 100
    # --warmup-check-every 50 --warmup-stop-toward 0.6 --warmup-steps 1500
    # --ppo-iterations 48 --split-seeds 0 1 2 3 4" in place of the warm-up flags above
    # the world-model reward on and off: the same with "--format free_think
    # --max-new-tokens 24" or "--format grounding_worldmodeling --max-new-tokens 128"
    # (docs/trainer.md, "The world-model reward on and off"); the whole comparison, with
    # the format guard (--invalid-penalty), the world-model weight 0 (--wm-weight 0) and
    # one warm-up rule: examples/format_grid.py (docs/experiments/2026-12-04-format-grid.md)
    # the learning test's warm-up, again (byte-identical on the same machine)
    .venv/bin/python examples/learn_frozenlake.py --write-test-warm-up DIR

What it does, on CPU with one thread, against a real `visenv serve`:

1. Levels. FrozenLake 4x4 with a random start and goal. Training levels come from each
   run seed's training range (`clients.eval.train_level_seed`); the held-out levels
   from the evaluation range (`clients.eval.eval_level_seeds`), with every level whose
   map (holes, start, goal) equals a training level's removed.
2. Baselines on the held-out levels: random actions; the best fixed plan (the action
   sequence that solves most of 1,000 training levels, found by exhaustive search);
   the oracle (a shortest safe path, the ceiling).
3. Per training seed: a tiny random Qwen2.5-VL, supervised warm-up on oracle episodes
   of training levels (the "warm-up alone" arm), then from that same warm-up PPO with
   each estimator at the same budget: bi_level (Bi-Level GAE), gae (token-level, one
   reward at the end: VAGEN-Base), turn_wise, grpo, and bi_level with the StarPO-S
   group filter. Every trained policy is evaluated greedily on the held-out levels.
4. Three observation variants: `text` (the map as a grid of symbols in the observation,
   VAGEN's text mode) for every arm; `natural` (one sentence per object: "The goal is
   below and to the left of the player.") and `vision` (the image only) for the warm-up
   and bi_level, to see which form of the map the tiny random model reads at all. The
   spread of each policy's first answer over the held-out levels says whether it reads
   the level: a blind policy gives one answer everywhere.

Results (per seed, mean, spread, 95% interval over seeds) go to `--json` after every
arm (a run cut short keeps what it measured), and a plot to `--plot`.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clients import EnvClient
from clients.eval import eval_level_seeds, train_level_seed
from clients.rollout import PolicyInput, Trajectory
from clients.types import SessionOptions
from env_server.core.spatial import grid_relation  # the server's words for a relation
from env_server.envs.frozenlake.env import generate_map  # the server's own generator
from trainer.config import load_config
from trainer.model import build_tiny_qwen, load_policy, save_policy
from trainer.ppo import train
from trainer.rollout import HFPolicy, attach_rewards
from trainer.skeleton import Skeleton
from trainer.trajectory import ChatLayout, EpisodeTokens, collate, policy_forward

ENV = "frozenlake"
FORMAT = "no_think"  # --format: the response format of every policy, demo and session
FORMATS = ("no_think", "free_think", "grounding_worldmodeling")
REASONING: dict[str, float] = {}  # --wm-weight: the session's `reasoning` option (server side)
SIZE, P_FROZEN = 4, 0.8
MAX_TURNS, PER_TURN = 3, 3  # the defaults (the learning test's); --max-turns/--per-turn
MOVES = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
ARMS = {  # PPO arms: config overrides on top of the common ones
    "bi_level": ["ppo.estimator=bi_level"],
    "gae": ["ppo.estimator=gae"],
    "turn_wise": ["ppo.estimator=turn_wise"],
    "grpo": ["ppo.estimator=grpo"],
    "bi_level+filter": ["ppo.estimator=bi_level", "ppo.filter_ratio=0.5", "ppo.clip_high=0.28"],
    # a tenth of the KL that held the format (k3 as a loss at 0.1): does the anchor to the
    # warm-up hold a reading policy back?
    "bi_level+kl0.01": ["ppo.estimator=bi_level", "ppo.kl_coef=0.01"],
}


VARIANTS = {  # observation variants: env config on top of the common one
    "text": {"render_mode": "text"},  # the grid of symbols (VAGEN's text mode)
    "natural": {"render_mode": "text", "text_as": "natural"},  # "The goal is below ..."
    "vision": {"render_mode": "vision"},  # the image only
}


def env_config(variant: str) -> dict[str, Any]:
    return {"size": SIZE, "p": P_FROZEN, "max_turns": MAX_TURNS,
            "max_actions_per_turn": PER_TURN, "image_size": 112, **VARIANTS[variant]}  # fmt: skip


# ----------------------------------------------------------------------------- server


def start_server() -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "visenv_cli", "serve", "--host", "127.0.0.1", "--port", "0",
           "--grpc-port", "0", "--workers", "1", "--envs", ENV]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    found: list[str] = []

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            m = re.search(r"gRPC ([\d.]+:\d+)", line)
            if m and not found:
                found.append(m[1])

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 120
    while not found:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("visenv serve did not start")
        time.sleep(0.1)
    time.sleep(1.0)
    return proc, found[0]


# ----------------------------------------------------------------------------- levels


def level_key(seed: int) -> tuple[str, ...]:
    """A level's map (holes, start, goal), as the server draws it from the seed."""
    return generate_map(SIZE, P_FROZEN, seed)


def held_out_levels(n: int, training: set[tuple[str, ...]]) -> tuple[list[int], int]:
    """n evaluation-range seeds with distinct maps, none equal to a training map;
    returns them and how many candidates were dropped as duplicates."""
    seeds, seen, dropped = [], set(training), 0
    for seed in eval_level_seeds(0, 10 * n):
        key = level_key(seed)
        if key in seen:
            dropped += 1
            continue
        seen.add(key)
        seeds.append(seed)
        if len(seeds) == n:
            return seeds, dropped
    raise RuntimeError("not enough distinct held-out levels")


def levels_record(training: set, eval_seeds: list[int], dropped: int) -> dict[str, int]:
    """What --merge compares to know that runs played the same held-out levels."""
    return {"held_out": len(eval_seeds), "held_out_first": eval_seeds[0],
            "duplicates_dropped": dropped, "training_maps": len(training)}  # fmt: skip


def split_levels(args) -> tuple[set[tuple[str, ...]], list[int], list[int], int]:
    """The maps every training seed may see (warm-up, PPO, the fixed plan's fit levels),
    the fixed plan's fit seeds, and the held-out seeds with how many were dropped."""
    n = max(args.demo_levels + args.validation_levels, args.ppo_iterations * args.episodes)
    training = {level_key(train_level_seed(s, i)) for s in args.split_seeds or args.seeds
                for i in range(n)}  # fmt: skip
    plan_seeds = [train_level_seed(0, i) for i in range(args.plan_levels)]
    training |= {level_key(s) for s in plan_seeds}
    eval_seeds, dropped = held_out_levels(args.eval_levels, training)
    return training, plan_seeds, eval_seeds, dropped


def best_fixed_plan(seeds: list[int], length: int) -> tuple[list[str], float]:
    """The action sequence of `length` moves (or a prefix of it) that solves the most of
    these levels, by exhaustive search over 4**length sequences, all levels at once."""
    maps = [level_key(s) for s in seeds]
    grid = np.array([[list(row) for row in m] for m in maps])  # (levels, size, size)
    hole, goal = grid == "H", grid == "G"
    start = np.array([np.argwhere(g == "S")[0] for g in grid])
    idx = np.arange(len(seeds))
    names = list(MOVES)
    deltas = np.array([MOVES[n] for n in names])
    best: list[Any] = [-1, []]

    def search(pos: np.ndarray, alive: np.ndarray, won: np.ndarray, plan: list[int]) -> None:
        count = int(won.sum())
        if count > best[0]:
            best[0], best[1] = count, list(plan)
        if len(plan) == length or not alive.any():
            return
        for a in range(4):
            nxt = np.where(alive[:, None], np.clip(pos + deltas[a], 0, SIZE - 1), pos)
            fell = alive & hole[idx, nxt[:, 0], nxt[:, 1]]
            arrived = alive & goal[idx, nxt[:, 0], nxt[:, 1]]
            search(nxt, alive & ~fell & ~arrived, won | arrived, plan + [a])

    search(start, np.ones(len(seeds), bool), np.zeros(len(seeds), bool), [])
    return [names[a] for a in best[1]], best[0] / len(seeds)


# ----------------------------------------------------------------------------- policies


def shortest_path(gt: dict) -> list[str]:
    from collections import deque

    start, goal = tuple(gt["player"]), tuple(gt["goal"])
    holes = {tuple(h) for h in gt["holes"]}
    prev: dict[tuple, Any] = {start: None}
    queue = deque([start])
    while queue:
        cell = queue.popleft()
        if cell == goal:
            break
        for name, (dr, dc) in MOVES.items():
            nxt = (cell[0] + dr, cell[1] + dc)
            if 0 <= nxt[0] < SIZE and 0 <= nxt[1] < SIZE and nxt not in holes and nxt not in prev:
                prev[nxt] = (cell, name)
                queue.append(nxt)
    path: list[str] = []
    cell = goal
    while prev.get(cell) is not None:
        cell, name = prev[cell]
        path.append(name)
    return path[::-1]


def answer(moves: list[str]) -> str:
    return f"<answer>{', '.join(moves or ['Up'])}</answer>"


def relation(obj: str, player: list[int], pos: list[int]) -> str:
    """Where `obj` is, seen from the player, in the words the server writes and grades
    relations with (`core.spatial`): "goal below right.", "hole same row left.", "goal
    same row same column." (on it). Both axes always; the server's sentence ("The goal is
    below and to the right of the player.") grades the same in 12 tokens instead of 4-5."""
    return f"{obj} {' '.join(grid_relation(player, pos))}."


def describe(player: list[int], goal: list[int], holes: list[list[int]]) -> str:
    """A state as the server grades <observation> and <prediction> (an F1 over every
    object's relation to the player): where the goal and every hole are."""
    return " ".join([relation("goal", player, goal)] + [relation("hole", player, h) for h in holes])


def moved(r: int, c: int, move: str | None) -> tuple[int, int]:
    """The cell one move leads to from (r, c): a move off the lake does nothing (the
    server's rule); None (no move) stays."""
    dr, dc = MOVES[move] if move else (0, 0)
    return min(max(r + dr, 0), SIZE - 1), min(max(c + dc, 0), SIZE - 1)


def after(gt: dict, moves: list[str]) -> list[int]:
    """Where the player stands after `moves` (the server's rules: a move off the lake
    does nothing; a hole or the goal ends the episode, and the moves after it)."""
    r, c = gt["player"]
    holes = [list(h) for h in gt["holes"]]
    for move in moves:
        r, c = moved(r, c, move)
        if [r, c] in holes or [r, c] == list(gt["goal"]):
            break
    return [r, c]


def respond(moves: list[str], gt: dict, fmt: str) -> str:
    """A scripted answer in `fmt`, true to the ground truth `gt` of the state it answers:
    no_think the moves alone; free_think a short reason first (where the goal is);
    grounding_worldmodeling the state seen (<observation>), that reason, the state the
    moves lead to (<prediction>), in the server's words for relations, so both grade 1.0."""
    moves = moves or ["Up"]
    if fmt == "no_think":
        return answer(moves)
    reason = relation("goal", gt["player"], gt["goal"])  # true whoever chose the moves
    if fmt == "free_think":
        return f"<think>{reason}</think>{answer(moves)}"
    if fmt != "grounding_worldmodeling":
        raise ValueError(f"no scripted answers in the {fmt} format")
    seen = describe(gt["player"], gt["goal"], gt["holes"])
    predicted = describe(after(gt, moves), gt["goal"], gt["holes"])
    return (f"<think><observation>{seen}</observation><reasoning>{reason}</reasoning>"
            f"<prediction>{predicted}</prediction></think>{answer(moves)}")  # fmt: skip


class ScriptedPolicy:
    """Answers `choose(input) -> moves`; with a layout, also lays the episode out as
    tokens (system, observations, the answer's tokens) as HFPolicy does."""

    def __init__(self, choose, layout: ChatLayout | None = None) -> None:
        self.choose = choose
        self.layout = layout
        self.episodes: dict[int, EpisodeTokens] = {}

    def __call__(self, batch: list[PolicyInput]) -> list[str]:
        texts = []
        for inp in batch:
            text = respond(self.choose(inp), inp.observation.ground_truth, FORMAT)
            if self.layout is not None:
                ep = self.episodes.setdefault(inp.episode, EpisodeTokens())
                if inp.turn == 0:
                    self.layout.system(ep, inp.system_prompt)
                images = [im.to_array() for im in inp.observation.images]
                self.layout.user(ep, inp.observation.text, images)
                ids = self.layout.tok(text, add_special_tokens=False).input_ids
                self.layout.response(ep, ids + [self.layout.im_end_id])
            texts.append(text)
        return texts


def oracle(inp: PolicyInput) -> list[str]:
    return shortest_path(inp.observation.ground_truth)[:PER_TURN]


def random_policy(draw: int):
    """Random moves (1 to PER_TURN a turn), seeded by the draw, the level and the turn, so
    they do not depend on the order the episodes run in."""

    def random_moves(inp: PolicyInput) -> list[str]:
        rng = random.Random(f"{draw}-{inp.seed}-{inp.turn}")
        return [rng.choice(list(MOVES)) for _ in range(rng.randint(1, PER_TURN))]

    return random_moves


# ----------------------------------------------------------------------------- evaluation


def summary(trajs: list[Trajectory]) -> dict[str, Any]:
    ok = [t for t in trajs if t.ok]
    if len(ok) != len(trajs):
        raise RuntimeError(f"{len(trajs) - len(ok)} evaluation episodes failed")
    return {
        "episodes": len(ok),
        "success_rate": float(np.mean([t.success for t in ok])),
        "reward": float(np.mean([t.total_reward for t in ok])),
        "valid_answer_rate": float(
            np.mean([bool(x.info.get("action_valid")) for t in ok for x in t.turns])
        ),
        **answer_spread(ok),
        **world_model_scores(ok),
    }


def world_model_scores(trajs: list[Trajectory]) -> dict[str, float]:
    """The server's mean grade of the <observation> and <prediction> sections over every
    turn that has them (a valid answer in grounding_worldmodeling); none in other formats."""
    out = {}
    for key in ("observation_score", "prediction_score"):
        scores = [x.info[key] for t in trajs for x in t.turns if x.info.get(key) is not None]
        if scores:
            out[key] = float(np.mean(scores))
    return out


def answer_spread(trajs: list[Trajectory]) -> dict[str, Any]:
    """Does the policy's first answer depend on the level? A policy that reads the map
    answers differently on different maps; a blind one gives one answer everywhere.
    `first_move_toward_goal`: the share of levels whose first move brings the player
    closer to the goal (the cue the natural sentences give most directly; the random
    baseline's figure is the blind reference). `distinct_first_moves`: the distinct
    <answer> sections alone (in formats that think first, the whole answer differs with
    what it says about the level even where the move does not)."""
    first = [t.turns[0].response for t in trajs if t.turns]
    values, counts = np.unique(first, return_counts=True)
    top = int(counts.argmax())
    moves = {m[1].strip() if (m := re.search(r"<answer>(.*?)</answer>", r, re.S)) else None
             for r in first}  # fmt: skip
    toward = []
    for t in trajs:
        move = (
            re.search(r"<answer>\s*(Left|Down|Right|Up)", t.turns[0].response) if t.turns else None
        )
        grid = level_key(t.seed)
        (sr, sc), (gr, gc) = [divmod("".join(grid).index(ch), SIZE) for ch in "SG"]
        r, c = moved(sr, sc, move[1] if move else None)
        toward.append(abs(r - gr) + abs(c - gc) < abs(sr - gr) + abs(sc - gc))
    return {"distinct_first_answers": len(values), "distinct_first_moves": len(moves),
            "top_first_answer": str(values[top]),
            "top_first_answer_share": float(counts[top] / len(first)),
            "first_move_toward_goal": float(np.mean(toward))}  # fmt: skip


def play(client: EnvClient, policy, seeds: list[int], variant: str) -> dict[str, Any]:
    trajs = client.run_episodes(policy, ENV, seeds, config=env_config(variant), format=FORMAT,
                                reasoning=REASONING, max_turns=MAX_TURNS, progress=False)  # fmt: skip
    return summary(trajs)


def skeleton_of(model, layout: ChatLayout) -> Skeleton:
    """The format guard --skeleton: constrained decoding of FORMAT's tags."""
    return Skeleton.for_model(model, layout.tok, FORMAT, layout.im_end_id)


def overridden(policy: HFPolicy) -> float:
    """The mean, over every turn played, of what the skeleton's mask overrode (greedy: the
    share of turns it changed; sampled: the chance the unguarded policy left the layout)."""
    turns = [x for per_turn in policy.unguarded.values() for x in per_turn]
    return float(np.mean(turns)) if turns else 0.0


def greedy_play(client, model, layout, seeds, variant, max_new_tokens,
                skeleton: Skeleton | None = None) -> dict[str, Any]:  # fmt: skip
    model.eval()
    policy = HFPolicy(model, layout, temperature=1.0, max_new_tokens=max_new_tokens,
                      batch_size=64, greedy=True, skeleton=skeleton)  # fmt: skip
    out = play(client, policy, seeds, variant)
    return out | ({"skeleton_overrode": overridden(policy)} if skeleton is not None else {})


def evaluate_model(client, model, layout, seeds, variant, max_new_tokens,
                   skeleton: Skeleton | None = None) -> dict[str, Any]:  # fmt: skip
    """Greedy play on the levels, and the success of one sampled try per level (T=1,
    seeded) under "sampled". With the format guard's `skeleton`, both decode under it,
    and "unguarded" is the same model's greedy play without it: what the policy itself
    writes."""
    out = greedy_play(client, model, layout, seeds, variant, max_new_tokens, skeleton)
    torch.manual_seed(12345)
    sampler = HFPolicy(model, layout, temperature=1.0, max_new_tokens=max_new_tokens,
                       batch_size=64, skeleton=skeleton)  # fmt: skip
    sampled = play(client, sampler, seeds, variant)
    out["sampled"] = {k: sampled[k] for k in ("success_rate", "valid_answer_rate")}
    if skeleton is not None:
        out["sampled"]["skeleton_overrode"] = overridden(sampler)
        free = greedy_play(client, model, layout, seeds, variant, max_new_tokens)
        out["unguarded"] = {k: free[k] for k in ("success_rate", "valid_answer_rate")}
    return out


# ----------------------------------------------------------------------------- warm-up


def warm_up(model, layout, episodes, epochs: int, lr: float, seed: int, batch_size: int = 8,
            steps: int | None = None, stop=None):  # fmt: skip
    """Supervised fine-tuning: cross-entropy on the response tokens of oracle episodes.
    With `steps`, exactly that many optimiser steps (epochs reshuffled as needed, the
    last one cut short) instead of `epochs` whole epochs: a warm-up stopped early.
    `stop(step)`, if given, is asked after every step; True ends the warm-up there."""
    image_id = layout.tok.convert_tokens_to_ids(layout.p.image_token)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    per_epoch = -(-len(episodes) // batch_size)
    if steps is not None:
        epochs = -(-steps // per_epoch)
    left = per_epoch * epochs if steps is None else steps
    done, halt = 0, False
    for _ in range(epochs):
        total, count = 0.0, 0
        for idx in torch.randperm(len(episodes), generator=g).split(batch_size)[:left]:
            left -= 1
            batch = collate([episodes[i] for i in idx.tolist()], layout.pad_id, image_id)
            logp = policy_forward(model, batch, 1.0, suppressed=layout.suppressed).logp
            mask = batch.loss_mask.float()
            loss = -(logp * mask).sum() / mask.sum()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            total, count = total + loss.item(), count + 1
            done += 1
            halt = stop is not None and stop(done)
            model.train()  # (a check plays in eval mode)
            if halt:
                break
        losses.append(total / count)
        if halt:
            break
    return losses


def build_model(client: EnvClient, cfg_env: dict[str, Any], seeds: list[int], out: Path, *,
                seed: int, hidden: int, layers: int) -> Path:  # fmt: skip
    """A tiny random Qwen2.5-VL whose tokenizer learnt its merges from this environment's
    prompts (the levels `seeds`) and answers."""
    texts = client.create([SessionOptions(ENV, config=cfg_env, seed=s, format=FORMAT)
                           for s in seeds])  # fmt: skip
    # (the map's rows are left out: learnt merges such as "OP" or "__" would hide where
    # each cell is; unmerged, every cell is one token)
    samples = [texts[0].system_prompt] * 8 + [
        re.sub(r"^[_OGPX√]+$", "", r.observation.text, flags=re.M) for r in texts
    ]
    samples += [answer(list(m)) for m in (["Up"], ["Down", "Left"], ["Right", "Right", "Up"])] * 8
    if FORMAT != "no_think":  # the oracle's first answers, so the format's words merge too
        samples += [respond(shortest_path(r.observation.ground_truth)[:PER_TURN],
                            r.observation.ground_truth, FORMAT) for r in texts]  # fmt: skip
    client.close([r.session_id for r in texts])
    return build_tiny_qwen(out, seed=seed, hidden_size=hidden, layers=layers, vocab_size=1024,
                           corpus=samples)  # fmt: skip


def oracle_demos(client: EnvClient, layout: ChatLayout, seeds: list[int],
                 cfg_env: dict[str, Any], choose=oracle) -> list[EpisodeTokens]:  # fmt: skip
    """The oracle's (or `choose`'s) episodes on these levels, as the policy's tokens, with
    their rewards."""
    policy = ScriptedPolicy(choose, layout)
    trajs = client.run_episodes(policy, ENV, seeds, config=cfg_env, format=FORMAT,
                                reasoning=REASONING, max_turns=MAX_TURNS, progress=False)  # fmt: skip
    return [attach_rewards(policy.episodes[t.episode], t) for t in trajs]


def answer_tokens(demos: list[EpisodeTokens]) -> list[int]:
    """The length in tokens of every answer in these episodes (without its <|im_end|>):
    what generation must be allowed (--max-new-tokens) to say them whole."""
    lengths: list[int] = []
    for ep in demos:
        run = 0
        for m in ep.loss_mask + [0]:
            if m:
                run += 1
            elif run:
                lengths.append(run - 1)
                run = 0
    return lengths


# ----------------------------------------------------------------------------- statistics

T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 9: 2.262}


def over_seeds(values: list[float]) -> dict[str, Any]:
    """Mean, sample std and a 95% t-interval over training seeds."""
    v = np.asarray(values, dtype=float)
    out: dict[str, Any] = {"per_seed": [float(x) for x in v], "mean": float(v.mean())}
    if len(v) > 1:
        std = float(v.std(ddof=1))
        half = T_975.get(len(v) - 1, 1.96) * std / math.sqrt(len(v))
        out |= {"std": std, "ci95": [float(v.mean() - half), float(v.mean() + half)]}
    return out


# ----------------------------------------------------------------------------- main


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/learn-frozenlake")
    ap.add_argument("--json", default=None, help="write the results here (after every arm)")
    ap.add_argument("--plot", default=None, help="write the summary plot here")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--arms", nargs="+", default=list(ARMS))
    ap.add_argument(
        "--probe-arms",
        nargs="*",
        default=["bi_level"],
        help="arms of the natural and vision variants (all arms run on text)",
    )
    ap.add_argument("--eval-levels", type=int, default=100)
    ap.add_argument("--split-seeds", type=int, nargs="+", default=None,
                    help="training seeds whose levels are removed from the held-out ones "
                    "(default --seeds; give all of them to run one seed per process on the "
                    "same held-out levels)")  # fmt: skip
    ap.add_argument("--demo-levels", type=int, default=128, help="warm-up levels per seed")
    ap.add_argument("--plan-levels", type=int, default=1000, help="levels the fixed plan is fit on")
    ap.add_argument("--warmup-epochs", type=int, default=8)
    ap.add_argument("--warmup-lr", type=float, default=3e-3)
    ap.add_argument("--warmup-steps", type=int, default=None,
                    help="stop the warm-up after this many steps of 8 episodes (overrides "
                    "--warmup-epochs): a warm-up that reads only a little")  # fmt: skip
    ap.add_argument("--validation-levels", type=int, default=0,
                    help="training-range levels after the warm-up's own (never trained on in "
                    "the warm-up, never held out) on which the warm-up is checked")  # fmt: skip
    ap.add_argument("--warmup-check-every", type=int, default=0,
                    help="every this many warm-up steps, play the validation levels greedily "
                    "and record success and first move towards the goal")  # fmt: skip
    ap.add_argument("--warmup-stop-toward", type=float, default=None,
                    help="stop the warm-up at the first check whose first move goes towards "
                    "the goal on at least this share of the validation levels (a warm-up that "
                    "reads partly; --warmup-steps is the most it may take)")  # fmt: skip
    ap.add_argument("--warmup-stop-valid", type=float, default=0.0,
                    help="with --warmup-stop-toward: stop only at a check whose greedy "
                    "valid-answer rate is at least this too (a format guard has a valid "
                    "format to keep)")  # fmt: skip
    ap.add_argument("--no-system-prompt", action="store_true",
                    help="leave the environment's system prompt out of the policy's context, "
                    "in the warm-up's data, PPO (env.system_prompt=false) and evaluation")  # fmt: skip
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--ppo-iterations", type=int, default=8)
    ap.add_argument("--episodes", type=int, default=16, help="episodes per PPO iteration")
    ap.add_argument("--group-size", type=int, default=4, help="episodes per level, every arm")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature in PPO")
    ap.add_argument("--actor-lr", type=float, default=1e-4)
    ap.add_argument("--critic-lr", type=float, default=1e-2)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--ppo-epochs", type=int, default=2)
    ap.add_argument(
        "--random-repeats",
        type=int,
        default=10,
        help="draws of the random baseline (each over every held-out level)",
    )
    ap.add_argument(
        "--baselines-only",
        action="store_true",
        help="recompute the baselines of the results in --json, keep its runs",
    )
    ap.add_argument("--reevaluate", action="store_true",
                    help="no training: evaluate the models a finished run left in --out again "
                    "(warm-up and last PPO checkpoint of every arm) and write --json")  # fmt: skip
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="merge the results of runs of one seed each (same --split-seeds) "
                    "into --json and --plot, and stop")  # fmt: skip
    ap.add_argument("--write-test-warm-up", default=None, metavar="DIR",
                    help="write the warm-up tests/trainer/test_learning.py starts from to DIR "
                    "and stop")  # fmt: skip
    ap.add_argument("--warm-up", default=None, metavar="DIR",
                    help="start every seed's PPO arms from this warm-up (e.g. the learning "
                    "test's) instead of building one per seed")  # fmt: skip
    ap.add_argument("--filter-ratio", type=float, default=1.0, help="StarPO-S, every arm")
    ap.add_argument("--kl-coef", type=float, default=0.001, help="PPO arms' KL coefficient")
    ap.add_argument("--kl-estimator", default="k1", choices=["k1", "k3"])
    ap.add_argument("--kl-mode", default=None, choices=["reward", "loss"])
    ap.add_argument("--clip", type=float, default=0.2, help="PPO ratio clip")
    ap.add_argument("--invalid-penalty", type=float, default=0.0,
                    help="the format guard: ppo.invalid_answer_penalty, taken off the reward "
                    "of every invalid answer in PPO (the episode goes on)")  # fmt: skip
    ap.add_argument("--skeleton", action="store_true",
                    help="the format guard generation.skeleton: PPO samples under constrained "
                    "decoding of the format's tags, and every model is evaluated under it "
                    "(its greedy play without it is reported as 'unguarded'); the warm-up's "
                    "own checks play without it")  # fmt: skip
    ap.add_argument("--kl-unmasked", action="store_true",
                    help="with --skeleton: ppo.kl_unmasked, the KL to the reference taken "
                    "without the mask, so the warm-up's own tags hold the policy's")  # fmt: skip
    ap.add_argument("--wm-weight", type=float, default=None,
                    help="the world-model reward's weight (the session's reasoning beta_s and "
                    "beta_w, server side; default the server's 0.5): 0 keeps the "
                    "grounding_worldmodeling layout and grading without its reward")  # fmt: skip
    ap.add_argument(
        "--p",
        type=float,
        default=P_FROZEN,
        help="probability that a cell is frozen (1.0: no holes)",
    )
    ap.add_argument("--max-turns", type=int, default=MAX_TURNS, help="turns per episode")
    ap.add_argument("--per-turn", type=int, default=PER_TURN, help="most moves per answer")
    ap.add_argument("--warm-up-policy", default="oracle", choices=["oracle", "random"],
                    help="whose episodes the warm-up imitates: the oracle's, or random valid "
                    "moves (format only, blind)")  # fmt: skip
    ap.add_argument("--format", default=FORMAT, choices=FORMATS,
                    help="the response format of every policy: baselines, the warm-up's "
                    "scripted demonstrations, PPO (env.format) and evaluation")  # fmt: skip
    return ap


def main() -> None:
    global MAX_TURNS, PER_TURN, P_FROZEN, FORMAT, REASONING  # one shape and format a run
    args = parser().parse_args()
    if args.kl_unmasked and not args.skeleton:
        raise SystemExit("--kl-unmasked changes the KL under --skeleton's mask: give both")
    MAX_TURNS, PER_TURN, P_FROZEN = args.max_turns, args.per_turn, args.p
    FORMAT = args.format
    if args.wm_weight is not None:
        REASONING = {"beta_s": args.wm_weight, "beta_w": args.wm_weight}
    torch.set_num_threads(1)
    if args.write_test_warm_up:
        write_test_warm_up(Path(args.write_test_warm_up))
        return
    if args.reevaluate:
        reevaluate(args)
        return
    if args.merge:
        merge(args)
        return
    t_start = time.time()
    report: dict[str, Any] = {"args": vars(args),
                              "env": env_config("text") | {"format": FORMAT, "reasoning": REASONING}}  # fmt: skip
    if args.baselines_only:
        if not args.json or not Path(args.json).exists():
            raise SystemExit("--baselines-only needs --json with the results of a run")
        report = json.loads(Path(args.json).read_text())
        # the levels and fixed plan depend on the run's seeds and sizes: use the run's
        for key in ("seeds", "demo_levels", "ppo_iterations", "episodes", "plan_levels",
                    "eval_levels"):  # fmt: skip
            setattr(args, key, report["args"][key])
    else:
        out = Path(args.out)
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)

    def save() -> None:
        key = "baselines_seconds" if args.baselines_only else "seconds"
        report[key] = time.time() - t_start
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))

    # levels ---------------------------------------------------------------------------
    training, plan_seeds, eval_seeds, dropped = split_levels(args)
    report["levels"] = levels_record(training, eval_seeds, dropped)
    t0 = time.time()
    plan, plan_fit = best_fixed_plan(plan_seeds, MAX_TURNS * PER_TURN)
    report["best_fixed_plan"] = {"plan": plan, "success_on_fit_levels": plan_fit,
                                 "fit_levels": len(plan_seeds), "search_seconds": time.time() - t0}  # fmt: skip
    report["best_fixed_plan"]["success_by_length"] = {
        n: best_fixed_plan(plan_seeds, n)[1] for n in range(1, MAX_TURNS * PER_TURN)
    } | {MAX_TURNS * PER_TURN: plan_fit}
    print("best fixed plan:", report["best_fixed_plan"], flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the server on the way out
    proc, address = start_server()
    try:
        client = EnvClient(address)
        # baselines -------------------------------------------------------------------
        report["baselines"] = baselines(client, eval_seeds, plan, args.random_repeats)
        save()

        if args.baselines_only:
            client.close_client()
            return finish(report, args, save)
        report["runs"] = {}
        for variant in args.variants:
            arms = args.arms if variant == "text" else args.probe_arms
            for seed in args.seeds:
                run_variant_seed(client, address, args, variant, seed, arms, eval_seeds,
                                 out / f"{variant}-{seed}", report,
                                 lambda: (summarise(report, args), save()))  # fmt: skip
        client.close_client()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finish(report, args, save)


def write_test_warm_up(out: Path) -> None:
    """The learning test's starting point: a hidden-64, 2-layer model, 3 epochs on the
    oracle's episodes of 256 levels of run seed 1, natural sentences; saved in bfloat16
    (about 460 KB). Deterministic: the same command writes the same weights."""
    torch.manual_seed(0)
    proc, address = start_server()
    try:
        client = EnvClient(address)
        cfg_env = env_config("natural")
        seeds = [train_level_seed(1, i) for i in range(256)]
        tmp = out.with_name(out.name + "-build")
        model, processing = load_policy(build_model(client, cfg_env, seeds[:64], tmp, seed=0,
                                                    hidden=64, layers=2))  # fmt: skip
        layout = ChatLayout(processing)
        losses = warm_up(model, layout, oracle_demos(client, layout, seeds, cfg_env), epochs=3,
                         lr=3e-3, seed=0)  # fmt: skip
        save_policy(model.to(torch.bfloat16), processing, out)
        shutil.rmtree(tmp)
        client.close_client()
        print("warm-up loss per epoch:", losses)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def finish(report: dict[str, Any], args, save) -> None:
    summarise(report, args)
    save()
    if args.plot:
        plot(report, args.plot)
    print(json.dumps(report["summary"], indent=1))


def baselines(client: EnvClient, eval_seeds: list[int], plan: list[str], repeats: int):
    """Random moves (mean over `repeats` draws; each episode's moves seeded by the draw,
    the level and the turn, so the figure does not depend on the order episodes run in),
    the best fixed plan and the oracle, on the held-out levels."""

    def fixed(inp: PolicyInput) -> list[str]:
        return plan[PER_TURN * inp.turn : PER_TURN * (inp.turn + 1)]

    draws = [play(client, ScriptedPolicy(random_policy(d)), eval_seeds, "text")
             for d in range(repeats)]  # fmt: skip
    rates = [d["success_rate"] for d in draws]
    out = {
        "random": draws[0] | {"success_rate": float(np.mean(rates)),
                              "reward": float(np.mean([d["reward"] for d in draws])),
                              "draws": repeats, "success_rate_min_max": [min(rates), max(rates)]},
        "fixed_plan": play(client, ScriptedPolicy(fixed), eval_seeds, "text"),
        "oracle": play(client, ScriptedPolicy(oracle), eval_seeds, "text"),
    }  # fmt: skip
    print("baselines:", out, flush=True)
    return out


def run_variant_seed(client, address, args, variant, seed, arms, eval_seeds, out: Path,
                     report, saved=lambda: None) -> None:  # fmt: skip
    """Warm-up and every PPO arm of one variant and training seed; `saved()` after each."""
    torch.manual_seed(seed)
    cfg_env = env_config(variant)
    runs = report["runs"].setdefault(variant, {})
    t0 = time.time()
    if args.warm_up:  # one given warm-up for every seed (its levels are in `training`)
        model, processing = load_policy(args.warm_up)
        layout = ChatLayout(processing, system_prompt=not args.no_system_prompt)
        warm, extra = Path(args.warm_up), {}
    else:
        demo_seeds = [train_level_seed(seed, i) for i in range(args.demo_levels)]
        path = build_model(client, cfg_env, demo_seeds[:64], out / "tiny", seed=seed,
                           hidden=args.hidden, layers=args.layers)  # fmt: skip
        model, processing = load_policy(path)
        layout = ChatLayout(processing, system_prompt=not args.no_system_prompt)
        # "random": random valid moves, a warm-up that teaches the answer format and
        # nothing about the level (blind), so everything above random is PPO's
        choose = oracle if args.warm_up_policy == "oracle" else random_policy(1000 + seed)
        demos = oracle_demos(client, layout, demo_seeds, cfg_env, choose)
        val_seeds = [train_level_seed(seed, args.demo_levels + i)
                     for i in range(args.validation_levels)]  # fmt: skip
        checks: list[dict[str, Any]] = []

        def stop(step: int, model=model) -> bool:
            """Check the warm-up on the validation levels (training range only)."""
            if not args.warmup_check_every or step % args.warmup_check_every:
                return False
            t_check = time.time()
            r = greedy_play(client, model, layout, val_seeds, variant, args.max_new_tokens)
            checks.append({"step": step, "seconds": t_check - t0,  # since this seed began
                           "check_seconds": time.time() - t_check} | {k: r[k] for k in (
                "success_rate", "first_move_toward_goal", "distinct_first_answers",
                "distinct_first_moves", "valid_answer_rate")})  # fmt: skip
            print(variant, seed, "warm-up check:", checks[-1], flush=True)
            goal = args.warmup_stop_toward
            return (goal is not None and r["first_move_toward_goal"] >= goal
                    and r["valid_answer_rate"] >= args.warmup_stop_valid)  # fmt: skip

        lengths = answer_tokens(demos)
        if max(lengths) > args.max_new_tokens:
            print(f"warning: the longest scripted answer is {max(lengths)} tokens, more than "
                  f"--max-new-tokens {args.max_new_tokens}", flush=True)  # fmt: skip
        losses = warm_up(model, layout, demos, args.warmup_epochs, args.warmup_lr, seed,
                         steps=args.warmup_steps, stop=stop)  # fmt: skip
        warm = save_policy(model, processing, out / "warm")
        extra = {"warmup_loss": losses,
                 "tokens_per_demo": float(np.mean([len(e.input_ids) for e in demos])),
                 "demo_answer_tokens": {"mean": float(np.mean(lengths)), "max": max(lengths)}}  # fmt: skip
        if checks:
            extra["warmup_validation"] = checks
    skeleton = skeleton_of(model, layout) if args.skeleton else None
    runs.setdefault("warm-up", {})[str(seed)] = {
        "eval": evaluate_model(client, model, layout, eval_seeds, variant, args.max_new_tokens,
                               skeleton),
        "seconds": time.time() - t0, **extra,
    }  # fmt: skip
    print(variant, seed, "warm-up:", runs["warm-up"][str(seed)]["eval"], flush=True)
    saved()
    del model

    for arm in arms:
        t0 = time.time()
        cfg = load_config(None, [
            f"env.servers=['{address}']", f"env.name={ENV}", f"env.format={FORMAT}",
            f"env.config={json.dumps(cfg_env)}", f"env.max_turns={MAX_TURNS}",
            f"env.reasoning={json.dumps(REASONING)}",
            f"env.system_prompt={not args.no_system_prompt}",
            f"model.path='{warm}'", "model.critic=head",
            f"generation.max_new_tokens={args.max_new_tokens}",
            f"generation.temperature={args.temperature}", "generation.batch_size=64",
            f"ppo.iterations={args.ppo_iterations}", f"ppo.episodes_per_iteration={args.episodes}",
            f"ppo.group_size={args.group_size}", "ppo.minibatch_size=8",
            f"ppo.epochs={args.ppo_epochs}", f"ppo.actor_lr={args.actor_lr}",
            f"ppo.critic_lr={args.critic_lr}", f"ppo.kl_coef={args.kl_coef}",
            f"ppo.kl_estimator={args.kl_estimator}", f"ppo.clip={args.clip}",
            f"ppo.filter_ratio={args.filter_ratio}",
            f"ppo.invalid_answer_penalty={args.invalid_penalty}",
            f"generation.skeleton={args.skeleton}", f"ppo.kl_unmasked={args.kl_unmasked}",
            *([f"ppo.kl_mode={args.kl_mode}"] if args.kl_mode else []),
            "run.save_every=1000", "run.threads=1",
            f"run.out_dir='{out / arm}'", f"run.seed={seed}", "run.progress=false",
            *ARMS[arm],
        ])  # fmt: skip
        result = train(cfg)
        actor = result.models.actor
        runs.setdefault(arm, {})[str(seed)] = {
            "eval": evaluate_model(
                client, actor, layout, eval_seeds, variant, args.max_new_tokens, skeleton
            ),
            "train_success": [m.get("success") for m in result.history],
            "train_valid": [m.get("action_valid") for m in result.history],
            "approx_kl": [m.get("approx_kl") for m in result.history],
            **(
                {"train_skeleton_overrode": [m.get("unguarded_break") for m in result.history]}
                if args.skeleton
                else {}
            ),  # fmt: skip
            "episodes_per_second": sum(m["episodes"] for m in result.history)
            / sum(m["rollout_seconds"] for m in result.history),
            "training_episodes_per_second": sum(m["episodes"] for m in result.history)
            / sum(m["iteration_seconds"] for m in result.history),
            "train_reward": [m.get("reward") for m in result.history],
            "seconds": time.time() - t0,
        }
        print(variant, seed, arm, runs[arm][str(seed)]["eval"], f"{time.time() - t0:.0f}s",
              flush=True)  # fmt: skip
        saved()
        del result, actor


def merge(args) -> None:
    """One report from runs of one training seed each: their runs side by side, the
    baselines of the first (they played the same held-out levels: checked). A seed's arm
    found in several files (the warm-up, when later runs start from it) is the first's."""
    parts = [json.loads(Path(f).read_text()) for f in args.merge]
    report = parts[0] | {"runs": {}, "merged_from": args.merge,
                         "seconds_per_part": [p.get("seconds") for p in parts]}  # fmt: skip
    for part in parts:
        if part["levels"] != parts[0]["levels"]:
            raise SystemExit(f"{args.merge}: the runs played different held-out levels")
        for variant, arms in part["runs"].items():
            for arm, by_seed in arms.items():
                mine = report["runs"].setdefault(variant, {}).setdefault(arm, {})
                for seed, run in by_seed.items():  # the first file's wins (a warm-up
                    mine.setdefault(seed, run)  # loaded again by --warm-up is evaluated again)
    summarise(report, args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    if args.plot:
        plot(report, args.plot)
    print(json.dumps(report["summary"], indent=1))


def reevaluate(args) -> None:
    """Greedy evaluation, on the held-out levels of these flags (--split-seeds may name
    more seeds than the run did: a wider split, shared with runs of more seeds), of the
    models in --out; the report merges (--merge) with runs on the same levels."""
    training, _, eval_seeds, dropped = split_levels(args)
    report: dict[str, Any] = {"args": vars(args), "runs": {},
                              "levels": levels_record(training, eval_seeds, dropped)}  # fmt: skip
    proc, address = start_server()
    try:
        client = EnvClient(address)
        for variant in args.variants:
            arms = args.arms if variant == "text" else args.probe_arms
            for seed in args.seeds:
                folder = Path(args.out) / f"{variant}-{seed}"
                model, processing = load_policy(folder / "warm")
                layout = ChatLayout(processing, system_prompt=not args.no_system_prompt)
                skeleton = skeleton_of(model, layout) if args.skeleton else None
                found = {"warm-up": None} | {
                    arm: sorted((folder / arm / "checkpoints").glob("iter-*.pt"))[-1]
                    for arm in arms
                }
                for arm, ckpt in found.items():
                    if ckpt is not None:
                        model.load_state_dict(torch.load(ckpt, weights_only=False)["actor"])
                    report["runs"].setdefault(variant, {}).setdefault(arm, {})[str(seed)] = {
                        "eval": evaluate_model(client, model, layout, eval_seeds, variant,
                                               args.max_new_tokens, skeleton)}  # fmt: skip
                    print(variant, seed, arm, report["runs"][variant][arm][str(seed)], flush=True)
                    if args.json:
                        Path(args.json).write_text(json.dumps(report, indent=1))
        client.close_client()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def summarise(report: dict[str, Any], args) -> None:
    """Per variant and arm: held-out success over the training seeds."""
    out: dict[str, Any] = {
        f"baseline/{k}": {"mean": v["success_rate"]} for k, v in report["baselines"].items()
    }
    for variant, arms in report.get("runs", {}).items():
        for arm, by_seed in arms.items():
            vals = [r["eval"]["success_rate"] for r in by_seed.values()]
            out[f"{variant}/{arm}"] = over_seeds(vals)
            sampled = [r["eval"]["sampled"]["success_rate"] for r in by_seed.values()
                       if "sampled" in r["eval"]]  # fmt: skip
            if sampled:
                out[f"{variant}/{arm}"]["sampled"] = over_seeds(sampled)
            for key in ("valid_answer_rate", "first_move_toward_goal"):
                vals = [r["eval"][key] for r in by_seed.values() if key in r["eval"]]
                if vals:
                    out[f"{variant}/{arm}"][key] = float(np.mean(vals))
    report["summary"] = out


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary_ = report["summary"]
    names = list(summary_)
    means = [summary_[n]["mean"] for n in names]
    lows = [summary_[n]["mean"] - summary_[n].get("ci95", [summary_[n]["mean"]] * 2)[0]
            for n in names]  # fmt: skip
    highs = [summary_[n].get("ci95", [0, summary_[n]["mean"]])[1] - summary_[n]["mean"]
             for n in names]  # fmt: skip
    fig, (ax, curves) = plt.subplots(1, 2, figsize=(14, 5), width_ratios=[3, 2])
    palette = {"baseline": "grey", "text": "tab:blue", "natural": "tab:green",
               "vision": "tab:orange"}  # fmt: skip
    colors = [palette[n.split("/")[0]] for n in names]
    ax.bar(range(len(names)), means, yerr=[lows, highs], color=colors, capsize=3)
    for i, n in enumerate(names):
        for v in summary_[n].get("per_seed", []):
            ax.plot(i, v, "k.", markersize=4)
    ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("held-out success rate (greedy)")
    ax.set_title(f"FrozenLake 4x4, {report['levels']['held_out']} held-out levels; "
                 "mean, 95% CI over seeds, dots: seeds", fontsize=9)  # fmt: skip
    for variant, arms in report.get("runs", {}).items():
        for arm, by_seed in arms.items():
            series = [r["train_success"] for r in by_seed.values() if "train_success" in r]
            if series:
                curves.plot(np.mean(np.array(series, dtype=float), axis=0),
                            label=f"{variant}/{arm}")  # fmt: skip
    curves.set_xlabel("PPO iteration")
    curves.set_ylabel("training success (sampled), mean over seeds")
    curves.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
