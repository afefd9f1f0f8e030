"""The format guard `generation.skeleton`: constrained decoding of a format's tags.

What must hold: every response sampled under the mask passes the server's layout check
(whatever the words inside the tags), it closes within the token budget, the update's
log-probs are the sampler's to float precision, and the policy still chooses the words
and the answer. Over a real server, a whole PPO iteration answers only in the layout."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from clients.rollout import PolicyInput
from env_server.core.types import ResponseFormat
from env_server.reasoning.formats import SECTIONS, VAGEN_LAYOUTS, _split_sections, _vagen_pattern
from examples import learn_frozenlake as lf
from trainer.config import ConfigError, load_config
from trainer.model import load_policy
from trainer.ppo import Models, kl_estimate, make_minibatch, train, update
from trainer.rollout import HFPolicy
from trainer.skeleton import Skeleton, token_bytes
from trainer.trajectory import ChatLayout, collate, policy_forward

FORMATS = [f.value for f in SECTIONS]  # the paper's five formats
VAGEN = [f.value for f in VAGEN_LAYOUTS]  # VAGEN main's, searched for in free text


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    model, processing = load_policy(tiny_model_path)
    return model.eval(), ChatLayout(processing)


def _skeleton(tiny, fmt):
    model, layout = tiny
    return Skeleton.for_model(model, layout.tok, fmt, layout.im_end_id)


def _walk(skeleton, layout, text, budget=500):
    """Feed `text` and <|im_end|> token by token; the first token the mask refuses, or
    None if all were allowed and the automaton ended."""
    ids = layout.tok(text, add_special_tokens=False).input_ids + [layout.im_end_id]
    state = torch.tensor([skeleton.start])
    for k, token in enumerate(ids):
        if not skeleton.allowed(state, torch.tensor([budget - k]))[0, token]:
            return layout.tok.decode([token])
        state = skeleton.advance(state, torch.tensor([token]))
    assert skeleton.names[int(state)] == ("end",)
    return None


def test_the_layouts_the_parser_accepts_pass_and_broken_ones_stop(tiny):
    """Each format's oracle-style answer passes, with whitespace between tags too; the
    ways PPO broke the long format (a tag doubled, missing, out of place, an empty
    section, text outside the tags) are stopped at the token that breaks them."""
    layout = tiny[1]
    gt = {"player": [0, 0], "goal": [3, 3], "holes": [[1, 1]]}
    for fmt in ("no_think", "free_think", "grounding_worldmodeling"):
        skeleton = _skeleton(tiny, fmt)
        text = lf.respond(["Down"], gt, fmt)
        assert _split_sections(text, ResponseFormat(fmt))[1] is None
        assert _walk(skeleton, layout, text) is None, (fmt, text)
        assert _walk(skeleton, layout, " \n" + text.replace("><", ">\n <") + "\n") is None
    gwm = _skeleton(tiny, "grounding_worldmodeling")
    good = lf.respond(["Down"], gt, "grounding_worldmodeling")
    broken = {
        "a tag doubled": good.replace("<reasoning>", "<reasoning><reasoning>"),
        "a tag missing": good.replace("</reasoning>", ""),
        "out of place": good.replace("<observation>", "<reasoning>", 1),
        "an empty section": good.replace("</observation>", "</observation>", 1).replace(
            good[good.index("<prediction>") + 12 : good.index("</prediction>")], " "),
        "text outside": good + " Down",
        "a tag's case": good.replace("<answer>", "<Answer>"),
    }  # fmt: skip
    for why, text in broken.items():
        assert _split_sections(text, ResponseFormat.GROUNDING_WORLDMODELING)[1] or why in (
            "a tag's case",  # the parser reads tags case-blind; the guard writes them as shown
        ), why
        assert _walk(gwm, layout, text) is not None, why


@pytest.mark.parametrize("cached", [True, False], ids=["turn-cache", "generate"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_sampled_response_has_the_layout(tiny, fmt, cached):
    """A random model's responses, sampled under the mask (both decoding paths), all
    pass the server's layout check and close within the budget, even a budget of the
    skeleton's fewest tokens; without the mask the same model never writes one."""
    model, layout = tiny
    skeleton = _skeleton(tiny, fmt)
    torch.manual_seed(0)
    for budget in (skeleton.shortest(), skeleton.shortest() + 4, 48):
        texts = _sample(model, layout, skeleton, budget, cached, rows=6)
        for ids, text in texts:
            assert len(ids) <= budget and ids[-1] == layout.im_end_id, (budget, ids)
            assert _split_sections(text, ResponseFormat(fmt))[1] is None, (budget, text)
    free = _sample(model, layout, None, 48, cached, rows=6)
    assert all(_split_sections(text, ResponseFormat(fmt))[1] for _, text in free)


@pytest.mark.parametrize("fmt", VAGEN)
def test_vagen_layouts_sample_what_the_vagen_parser_finds(tiny, fmt):
    """VAGEN main's layouts (navigation's <action> answer tag too): every sampled response
    holds the layout the server searches for, with a non-empty answer."""
    model, layout = tiny
    for tag in ("answer", "action"):
        skeleton = Skeleton.for_model(model, layout.tok, fmt, layout.im_end_id, answer_tag=tag)
        torch.manual_seed(0)
        for _, text in _sample(model, layout, skeleton, 40, True, rows=6):
            found = _vagen_pattern(ResponseFormat(fmt), tag).search(text)
            assert found is not None and found.group("answer").strip(), (tag, text)


def _sample(model, layout, skeleton, budget, cached, rows, greedy=False):
    policy = HFPolicy(model, layout, temperature=1.0, max_new_tokens=budget, batch_size=4,
                      kv_cache=cached, skeleton=skeleton, greedy=greedy)  # fmt: skip
    batch = [PolicyInput(episode=e, seed=e, turn=0, observation=_Obs(f"level {e}"),
                         system_prompt="Answer in the format.", history=[])
             for e in range(rows)]  # fmt: skip
    texts = policy(batch)
    eps = [policy.episodes[e] for e in range(rows)]
    answers = [[i for i, m in zip(ep.input_ids, ep.loss_mask, strict=True) if m] for ep in eps]
    return list(zip(answers, texts, strict=True))


class _Obs:
    def __init__(self, text: str) -> None:
        self.text, self.images = text, []


def test_budget_below_the_skeleton_is_refused(tiny):
    skeleton = _skeleton(tiny, "grounding_worldmodeling")
    skeleton.check_budget(skeleton.shortest())
    with pytest.raises(ValueError, match="max_new_tokens"):
        skeleton.check_budget(skeleton.shortest() - 1)


def test_update_takes_logprobs_under_the_sampling_mask(tiny):
    """The log-prob of every sampled token, as the sampler kept it, equals the update's
    pass over the episode with the skeleton (the mask each token was sampled under);
    without it the update would see another policy."""
    model, layout = tiny
    skeleton = _skeleton(tiny, "grounding_worldmodeling")
    torch.manual_seed(1)
    policy = HFPolicy(model, layout, temperature=0.7, max_new_tokens=40, batch_size=4,
                      skeleton=skeleton)  # fmt: skip
    for turn in range(2):
        policy([PolicyInput(episode=e, seed=e, turn=turn, observation=_Obs(f"obs {e} {turn}"),
                            system_prompt="S", history=[]) for e in range(3)])  # fmt: skip
    eps = [policy.episodes[e] for e in range(3)]
    batch = collate(eps, layout.pad_id, 0)
    with torch.no_grad():
        out = policy_forward(model, batch, 0.7, suppressed=layout.suppressed, skeleton=skeleton,
                             free=True)  # fmt: skip
        free, free_entropy, _, _ = policy_forward(model, batch, 0.7, suppressed=layout.suppressed)
    guarded, entropy = out.logp, out.entropy
    # the unmasked log-probs (ppo.kl_unmasked's) come from the same pass, and are the
    # policy's without the skeleton
    assert torch.allclose(out.free_logp, free, atol=1e-6)
    for row, ep in enumerate(eps):
        agent = [i for i, m in enumerate(ep.loss_mask) if m]
        sampled = [lp for turn in policy.logprobs[row] for lp in turn]
        assert torch.allclose(guarded[row, agent], torch.tensor(sampled), atol=1e-5)
        assert (guarded[row, agent] >= free[row, agent] - 1e-6).all()
        assert (guarded[row, agent] > free[row, agent] + 0.1).any()  # the mask took mass away
        assert (entropy[row, agent] <= free_entropy[row, agent] + 1e-4).all()
        forced = [i for i, (s, left) in zip(agent, [(ep.skeleton_state[i], ep.skeleton_left[i])
                                                    for i in agent], strict=True)
                  if skeleton.allowed(torch.tensor([s]), torch.tensor([left])).sum() == 1]  # fmt: skip
        assert forced and all(abs(float(guarded[row, i])) < 1e-6 for i in forced)
    # what the mask overrode is reported per turn, as a chance in [0, 1]
    assert all(len(v) == 2 and all(0.0 <= x <= 1.0 for x in v) for v in policy.unguarded.values())
    assert max(x for v in policy.unguarded.values() for x in v) > 0.5  # a random model breaks it


def test_greedy_follows_the_policy_until_it_leaves_the_skeleton(tiny):
    """Greedy under the mask is the policy's own greedy answer up to the first token that
    would leave the skeleton, and differs there; that turn is reported as overridden."""
    model, layout = tiny
    for fmt in ("no_think", "free_think"):
        skeleton = _skeleton(tiny, fmt)
        guarded = _sample(model, layout, skeleton, 16, True, rows=3, greedy=True)
        plain = _sample(model, layout, None, 16, True, rows=3, greedy=True)
        for (g_ids, _), (p_ids, _) in zip(guarded, plain, strict=True):
            state, k = torch.tensor([skeleton.start]), 0
            while k < len(p_ids) and skeleton.allowed(state, torch.tensor([16 - k]))[0, p_ids[k]]:
                state = skeleton.advance(state, torch.tensor([p_ids[k]]))
                k += 1
            assert g_ids[:k] == p_ids[:k]
            assert k == len(p_ids) == len(g_ids) or g_ids[k] != p_ids[k]
    # the report: greedy turns are 1.0 (overridden) or 0.0, never in between
    policy = HFPolicy(model, layout, temperature=1.0, max_new_tokens=16, batch_size=4,
                      greedy=True, skeleton=_skeleton(tiny, "no_think"))  # fmt: skip
    policy([PolicyInput(episode=0, seed=0, turn=0, observation=_Obs("x"), system_prompt="S",
                        history=[])])  # fmt: skip
    assert policy.unguarded[0] == [1.0]  # a random model's argmax is not "<answer>"


def test_config_refuses_what_cannot_keep_the_mask(tmp_path):
    base = ["env.servers=['a:1']", "model.path=m", "generation.skeleton=true"]
    assert load_config(None, base).generation.skeleton
    with pytest.raises(ConfigError, match="generation.skeleton"):
        load_config(None, [*base, "generation.backend=openai", "generation.base_url=http://h/v1"])
    with pytest.raises(ConfigError, match="generation.skeleton"):
        load_config(None, [*base, "ppo.axpo=true", "ppo.group_size=2",
                           "ppo.episodes_per_iteration=2"])  # fmt: skip
    assert load_config(None, [*base, "ppo.kl_unmasked=true"]).ppo.kl_unmasked
    for what in (["ppo.kl_coef=0"], ["generation.skeleton=false"]):
        with pytest.raises(ConfigError, match="ppo.kl_unmasked"):
            load_config(None, [*base, "ppo.kl_unmasked=true", *what])


def test_kl_unmasked_holds_the_policys_own_tags(tiny):
    """Under the mask a forced token has log-prob 0 for the actor and the reference, so the
    KL is 0 there and nothing holds the actor's own writing of the tags. ppo.kl_unmasked
    takes the KL without the mask: it is > 0 on forced tokens once the actor has drifted,
    and one update on it alone raises the actor's unmasked log-prob of those tokens."""
    model, layout = tiny
    skeleton = _skeleton(tiny, "grounding_worldmodeling")
    reference = model
    actor = copy.deepcopy(model).train()
    torch.manual_seed(3)
    with torch.no_grad():
        for w in actor.parameters():
            w.add_(torch.randn_like(w) * 0.05)
    torch.manual_seed(4)
    policy = HFPolicy(actor, layout, temperature=1.0, max_new_tokens=40, batch_size=4,
                      skeleton=skeleton)  # fmt: skip
    policy([PolicyInput(episode=e, seed=e, turn=0, observation=_Obs(f"obs {e}"),
                        system_prompt="S", history=[]) for e in range(2)])  # fmt: skip
    episodes = [policy.episodes[e] for e in range(2)]
    for e, ep in enumerate(episodes):
        ep.info |= {"reward": 0.0, "seed": e}
    base = ["env.servers=['a:1']", "model.path=m", "generation.skeleton=true",
            "ppo.kl_coef=1", "ppo.kl_mode=loss", "ppo.kl_estimator=k3", "ppo.estimator=grpo",
            "ppo.entropy_coef=0", "generation.temperature=1", "ppo.group_size=2",
            "ppo.episodes_per_iteration=2"]  # fmt: skip
    models = Models(actor, reference, None, layout, 0, skeleton)
    batch = collate(episodes, layout.pad_id, 0)
    allowed = skeleton.allowed(batch.skeleton_state[:, 1:], batch.skeleton_left[:, 1:])
    forced = torch.zeros_like(batch.loss_mask, dtype=torch.bool)
    forced[:, 1:] = (allowed.sum(-1) == 1) & batch.loss_mask[:, 1:].bool()
    assert forced.sum() >= 10

    def kl_on_forced(unmasked: bool) -> tuple[float, float]:
        cfg = load_config(None, [*base, f"ppo.kl_unmasked={str(unmasked).lower()}"])
        mb = make_minibatch(cfg, models, episodes, torch.device("cpu"))
        kl = kl_estimate(mb.old_kl_logp, mb.ref_logp, "k3")
        return float(kl[forced].sum()), float(kl[~forced & mb.mask.bool()].mean())

    masked_forced, masked_rest = kl_on_forced(False)
    assert masked_forced == 0.0 and masked_rest > 0  # the drift is seen only off the forced
    unmasked_forced, _ = kl_on_forced(True)
    assert unmasked_forced > 0

    def own_tags() -> float:
        with torch.no_grad():
            free = policy_forward(actor, batch, 1.0, suppressed=layout.suppressed).logp
        return float(free[forced].mean())

    cfg = load_config(None, [*base, "ppo.kl_unmasked=true"])
    mb = make_minibatch(cfg, models, episodes, torch.device("cpu"))
    mb.advantages = torch.zeros_like(mb.old_logp)  # the KL alone moves the actor
    before = own_tags()
    stats = update(cfg, models, {"actor": torch.optim.SGD(actor.parameters(), lr=0.05)}, mb)
    assert stats["kl_loss"] > 0
    assert own_tags() > before


def test_ppo_iteration_over_a_real_server_answers_only_in_the_layout(
    visenv_server, tiny_model_path, tmp_path
):
    """train() with the guard: every turn the server parsed passed its layout check (a
    random model's answers are refused for their actions only), the update ran on those
    tokens, and the metrics say how often the unguarded policy would have broken it."""

    def run(skeleton: bool, out):
        cfg = load_config(None, [
            f"env.servers=['{visenv_server.grpc}']", "env.name=frozenlake",
            "env.format=grounding_worldmodeling", "env.max_turns=2",
            'env.config={"render_mode": "text"}', f"model.path='{tiny_model_path}'",
            "model.critic=head", "generation.max_new_tokens=40",
            f"generation.skeleton={str(skeleton).lower()}", "ppo.iterations=1",
            "ppo.episodes_per_iteration=4", "ppo.minibatch_size=2", "run.save_episodes=4",
            f"run.out_dir='{out}'", "run.progress=false", "run.threads=1",
        ])  # fmt: skip
        history = train(cfg).history[0]
        lines = (out / "episodes").glob("*.jsonl")
        turns = [t for path in lines for line in path.read_text().splitlines()
                 for t in json.loads(line)["steps"]]  # fmt: skip
        return history, turns

    on, turns = run(True, tmp_path / "on")
    assert turns and on["unguarded_break"] > 0.5
    for turn in turns:
        fields, layout_error = _split_sections(
            turn["response"], ResponseFormat.GROUNDING_WORLDMODELING
        )
        assert layout_error is None, turn["response"]
    assert all(t["info"].get("parse_error") for t in turns if not t["info"]["action_valid"])
    off, plain_turns = run(False, tmp_path / "off")
    assert "unguarded_break" not in off
    assert any(
        _split_sections(t["response"], ResponseFormat.GROUNDING_WORLDMODELING)[1]
        for t in plain_turns
    )


@pytest.mark.parametrize("fmt", FORMATS)
def test_table_is_every_token_read_from_every_state(tiny, fmt):
    """The table, built from candidate tokens only (by first byte, and at once in a
    section's text), is the automaton read over every token from every state."""
    skeleton = _skeleton(tiny, fmt)
    layout = tiny[1]
    for t in range(len(layout.tok)):
        data = token_bytes(layout.tok, t)
        for s in range(len(skeleton.names)):
            if t == layout.im_end_id:
                want = skeleton.end if s == skeleton.after_last else -1
            elif t in layout.tok.all_special_ids or not data:
                want = -1
            else:
                after = skeleton._read(s, data)
                want = -1 if after is None else after
            assert int(skeleton.next[s, t]) == want, (skeleton.names[s], data)
