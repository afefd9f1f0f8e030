"""Replies whose ground truth and infos travel as JSON text (`wire.JSONText`): the worker
writes them, the API process passes the text to gRPC unread. The proof that this changes
no byte on either wire: every reply, built from the text, gives the same protobuf bytes
and the same REST JSON as the same reply built from values; and the cases that must go as
values (a non-finite number, a score key in the worker's info) still do."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from env_server.core.types import plain
from env_server.reasoning import ReasoningConfig, TurnScore
from env_server.service.assemble import assemble_reward
from env_server.service.messages import Create, Fork, Reset, Step
from env_server.service.models import ActionModel, SessionOptions
from env_server.service.rewards import writable
from env_server.service.worker import Worker, _truth_json
from visenv import wire


def _mk(sid, options, reasoning=None):  # a Create as the service sends it: validated options
    return Create(sid, SessionOptions(**options), reasoning or ReasoningConfig())


# a session graded by the LLM judge: its worker leaves a step's reward to be assembled
# (by the API process, once the judge's scores are in); no judge is called here
JUDGED = ReasoningConfig(grader="judge", judge={"base_url": "http://127.0.0.1:9/v1", "model": "m"})


GRID = "######\n#_P__#\n#_X__#\n#__O_#\n#____#\n######"


def _rest(reply: wire.SessionReply) -> bytes:
    """The REST body of a one-item batch, as Starlette's JSONResponse writes it."""
    body = {"results": [wire.batch_item_json(reply)]}
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def _from_values(reply: wire.SessionReply) -> wire.SessionReply:
    """The same reply with every field held as its value."""
    return wire.SessionReply.from_json(json.loads(json.dumps(reply.to_json())))


def _over_the_pipe(answers: list) -> list:
    data = pickle.dumps((1, answers), protocol=pickle.HIGHEST_PROTOCOL)
    return pickle.loads(data)[1]


def _responses(rng: random.Random) -> list[str]:
    moves = ", ".join(rng.choice(["Up", "Down", "Left", "Right"]) for _ in range(2))
    return [
        f"<think><observation>{GRID}</observation><reasoning>r</reasoning>"
        f"<prediction>{GRID}</prediction></think><answer>{moves}</answer>",
        "<think>no tags closed <answer>Up",  # a format error
        "<think><observation>the box is left of me</observation><reasoning>é ünïcode ✓"
        "</reasoning><prediction>the box is on the target</prediction></think>"
        "<answer>Jump</answer>",  # an unknown action, non-ASCII text
    ]


@pytest.mark.parametrize("env", ["sokoban", "frozenlake"])
def test_replies_from_text_are_the_same_on_both_wires(env):
    worker, rng = Worker(), random.Random(3)
    options = {"env": env, "format": "grounding_worldmodeling", "image_encoding": "png"}
    ids = [f"s-{n}" for n in range(3)]
    created = _over_the_pipe(worker.handle([_mk(s, {**options, "seed": n})
                                            for n, s in enumerate(ids)]))  # fmt: skip
    checked = 0
    for round_ in range(8):
        messages = [Step(s, t) for s, t in zip(ids, _responses(rng), strict=True)]
        if round_ % 2:
            messages[0] = Step(ids[0], actions=[ActionModel(name="Left")])  # manual play
        answers = _over_the_pipe(worker.handle(messages))
        done = [s for s, a in zip(ids, answers, strict=True) if a.reply.done]
        replies = [a.reply for a in answers]  # finished by the worker
        replies += _over_the_pipe(worker.handle([Reset(s) for s in done]))
        for reply in [*created, *replies]:
            obs = reply.observation
            assert obs.json_text("ground_truth") is not None and obs.json_text("info") is not None
            # (a worker's first create adds its warm-up time to the info it wrote)
            assert reply.json_text("info") is not None or "warm_up_s" in reply.info
            assert writable(reply) == (reply, reply)
            proto = wire.batch_to_proto([reply]).SerializeToString()
            twin = _from_values(reply)  # (reading `reply` decodes its text)
            assert twin.json_text("info") is None
            assert proto == wire.batch_to_proto([twin]).SerializeToString()
            assert _rest(reply) == _rest(twin)
            assert reply == twin
            checked += 1
        created = []
    assert checked > 20


def test_the_score_keys_come_first_in_the_text_as_in_the_values():
    worker = Worker()
    worker.handle([_mk("s-1", {"env": "frozenlake", "seed": 1}, JUDGED)])
    score = TurnScore(format=0.5, observation_score=0.25, prediction_score=None,
                      world_model=0.1, judge_error="timed out")  # fmt: skip
    [stepped] = _over_the_pipe(worker.handle([Step("s-1", "<answer>Left</answer>")]))
    values = copy.deepcopy(stepped)
    values.reply.info = dict(values.reply.info)  # held as its value from here on
    assert values.reply.json_text("info") is None
    text = assemble_reward(stepped, score, ReasoningConfig())
    value = assemble_reward(values, score, ReasoningConfig())
    assert text.json_text("info") is not None and value.json_text("info") is None
    assert text.observation.json_text("info") is not None
    assert wire.batch_to_proto([text]) == wire.batch_to_proto([value])
    assert list(text.info) == list(value.info) and text.info == value.info
    assert list(text.info)[:3] == ["observation_score", "prediction_score", "judge_error"]


def test_a_field_read_and_changed_is_written_from_its_value():
    worker = Worker()
    [made] = _over_the_pipe(worker.handle([_mk("s-1", {"env": "frozenlake", "seed": 1})]))
    made.observation.ground_truth["changed"] = True  # reading it decodes the text
    made.info["changed"] = 1
    msg = wire.SessionReply.from_proto(made.to_proto())
    assert msg.observation.ground_truth["changed"] is True and msg.info["changed"] == 1
    again = pickle.loads(pickle.dumps(made))  # pickled as the values, not the old text
    assert again.observation.ground_truth["changed"] is True and again.info["changed"] == 1
    assert again == made and again.observation.json_text("ground_truth") is None


def test_a_non_finite_number_goes_as_values_and_is_found():
    worker = Worker()
    worker.handle([_mk("s-1", {"env": "frozenlake", "seed": 1})])
    session = worker.sessions["s-1"]
    truth = {**session.obs.ground_truth, "distance": math.inf}
    session.obs = dataclasses.replace(session.obs, ground_truth=truth)  # an env's bug
    [reply] = _over_the_pipe([worker._reply("s-1", session, None)])
    assert reply.observation.json_text("ground_truth") is None
    assert reply.json_text("info") is not None  # the other parts still go as text
    stored, error = writable(reply)
    assert error.code == "INTERNAL"
    assert stored.info["unwritable"]["fields"] == ["observation.ground_truth.distance"]
    assert stored.observation.ground_truth["distance"] is None


def test_a_non_finite_judge_score_is_found_in_the_info():
    worker = Worker()
    worker.handle([_mk("s-1", {"env": "frozenlake", "seed": 1}, JUDGED)])
    [stepped] = worker.handle([Step("s-1", "<answer>Left</answer>")])
    score = TurnScore(format=1.0, observation_score=math.nan, prediction_score=None,
                      world_model=0.0)  # fmt: skip
    reply = assemble_reward(stepped, score, ReasoningConfig())
    assert reply.json_text("info") is None
    stored, error = writable(reply)
    assert error.code == "INTERNAL"
    assert stored.info["unwritable"]["fields"] == ["info.observation_score"]


def test_a_score_key_in_the_workers_info_goes_as_values():
    worker = Worker()
    worker.handle([_mk("s-1", {"env": "frozenlake", "seed": 1})])
    session = worker.sessions["s-1"]
    reply = worker._reply("s-1", session, None, info={"judge_error": "the env's own"})
    assert reply.json_text("info") is None


def _state(reply: wire.SessionReply) -> tuple:
    """Everything a reply holds: its type, fields (each part's type too) and unread texts."""
    obs = reply.observation
    return (
        type(reply), type(obs), type(reply.reward_parts), [type(im) for im in obs.images],
        reply.json_text("info"), obs.json_text("ground_truth"), obs.json_text("info"),
        wire.batch_to_proto([reply]).SerializeToString(), _rest(reply),
    )  # fmt: skip


def test_a_reply_pickled_comes_back_the_same():
    """`SessionReply` crosses the pipe as its wire form (`_from_wire`: its protobuf bytes)
    when its parts are JSON text, else field by field: either way the reply that comes
    back holds the same fields and the same unread texts, whether its parts were text or
    values, with or without images and a system prompt."""
    worker = Worker()
    made = worker.handle([
        _mk("s-1", {"env": "sokoban", "seed": 3, "config": {"dim_room": [6, 6], "num_boxes": 1}}),
        _mk("s-2", {"env": "frozenlake", "seed": 1, "representation": "symbolic"}),
    ])  # fmt: skip
    stepped = worker.handle([Step("s-1", _responses(random.Random(0))[0]), Step("s-2", "Up")])
    replies = [*made, *(s.reply for s in stepped)]
    read = copy.deepcopy(replies[-1])
    read.info["read"] = 1  # a text field read (and changed): goes as its value
    read.observation.ground_truth  # noqa: B018  (read only)
    no_images = dataclasses.replace(
        replies[0], observation=dataclasses.replace(replies[0].observation, images=())
    )
    for reply in [*replies, read, no_images, _from_values(replies[2])]:
        data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        as_text = reply.json_text("info") is not None and reply.observation.json_text("info")
        assert (b"_from_wire" in data) == bool(as_text and reply is not read)
        again = pickle.loads(data)
        wire_form = again.wire_bytes()
        assert wire.batch_to_proto([again]).SerializeToString() == (
            wire.batch_to_proto([reply]).SerializeToString()
        )  # written from the bytes as they came, while unread
        assert again.wire_bytes() == wire_form
        assert again == reply and _state(again) == _state(reply)
        assert again.wire_bytes() is None  # read: written from its fields from now on


def test_a_subclass_of_the_reply_is_pickled_field_by_field():
    from clients.types import SessionReply  # the SDK's reply: adds the server it came from

    [made] = _over_the_pipe(Worker().handle([_mk("s-1", {"env": "frozenlake", "seed": 1})]))
    fields = {f.name: getattr(made, f.name) for f in dataclasses.fields(wire.SessionReply)}
    served = SessionReply(**fields, server="http://a")
    data = pickle.dumps(served)
    assert b"_from_wire" not in data
    again = pickle.loads(data)
    assert type(again) is SessionReply and again == served and again.server == "http://a"


_SCORES = [None, 0.0, -0.0, 1.0, 0.5, 1 / 3, 1e-7, 1e16, 123456789.123, 0, 1, True, False,
           math.nan, math.inf, -math.inf, "timeout", "é \u2713 \"quoted\"\n"]  # fmt: skip


@pytest.mark.parametrize("judge_error", [None, "the judge timed out", "é"])
def test_the_scores_text_is_json_dumps_or_refused(judge_error):
    """`assemble_reward` writes the score keys' text itself for the usual scores: byte for
    byte `json.dumps`'s, and None (values, for `writable` to find) for a non-finite one."""
    from env_server.service.assemble import _scores_text

    for obs in _SCORES:
        for pred in _SCORES:
            scores = {
                "observation_score": obs,
                "prediction_score": pred,
                "judge_error": judge_error,
            }
            finite = not any(isinstance(v, float) and not math.isfinite(v) for v in (obs, pred))
            assert _scores_text(scores) == (json.dumps(scores) if finite else None)


def test_writable_takes_a_reply_with_every_number_finite_as_it_is():
    [stepped] = Worker().handle([_mk("s-1", {"env": "frozenlake", "seed": 1})])
    for reward in (0.0, -0.0, 1e300, 3, 10**400):  # (an int too large for a float, too)
        stepped.reward = reward
        assert writable(stepped) == (stepped, stepped)
    for reward in (math.nan, math.inf, -math.inf):
        stepped.reward = reward
        stored, error = writable(stepped)
        assert error.code == "INTERNAL" and stored.reward == 0.0


# ---- the ground truth's fixed entries, encoded once (`worker._truth_json`) ----------------

_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=12,
)  # fmt: skip
_KEYS = st.sampled_from(["walls", "grid_size", "player", "é", "relations", "n"])


@settings(max_examples=300, deadline=None)
@given(
    truth=st.dictionaries(_KEYS, _JSON_VALUES, max_size=6),
    fixed=st.frozensets(_KEYS, max_size=4),
    odd_key=st.sampled_from([None, True, 1, 2.5]),
)
def test_the_ground_truths_text_is_json_dumps_of_its_plain_values(truth, fixed, odd_key):
    """Written entry by entry, with the fixed ones from the cache on the second reply:
    byte for byte `json.dumps(plain(truth))`, also where plain() renames a non-str key."""
    known: dict = {}
    want = json.dumps(plain(truth))
    assert _truth_json(truth, fixed, known) == want
    assert _truth_json(truth, fixed, known) == want  # the fixed entries' texts kept
    assert set(known) == fixed & set(truth)
    odd = {odd_key: 1, **truth, str(odd_key): 2}  # plain() merges these two
    assert _truth_json(odd, fixed, known) == json.dumps(plain(odd))


def test_a_fixed_entry_is_encoded_again_when_it_is_another_object():
    walls, known = [[0, 0], [0, 1]], {}
    fixed = frozenset({"walls"})
    assert (
        _truth_json({"p": 1, "walls": walls}, fixed, known) == '{"p": 1, "walls": [[0, 0], [0, 1]]}'
    )
    assert known["walls"][0] is walls
    other = [[2, 2]]  # a new episode's walls
    assert _truth_json({"p": 2, "walls": other}, fixed, known) == '{"p": 2, "walls": [[2, 2]]}'
    with pytest.raises(ValueError):  # a non-finite number: refused, as json.dumps's
        _truth_json({"walls": [math.inf]}, fixed, known)
    with pytest.raises(TypeError, match=r"ground_truth\.walls\[0\]"):  # named, as plain() does
        _truth_json({"walls": [object()]}, fixed, known)


def test_sokoban_replies_carry_each_ground_truths_own_text():
    """Over steps, resets and a fork, every reply's ground truth text is `json.dumps` of
    the environment's ground truth at that moment, and the walls' text was written once
    per episode (the cache holds the episode's own walls object)."""
    worker, rng = Worker(), random.Random(5)
    cfg = {"dim_room": [6, 6], "num_boxes": 1, "max_turns": 3}
    ids = ["s-1", "s-2"]
    replies = list(worker.handle([_mk(s, {"env": "sokoban", "seed": n, "config": cfg})
                                  for n, s in enumerate(ids)]))  # fmt: skip
    worker.handle([Fork("s-1", ("s-3",))])
    ids.append("s-3")
    checked = resets = 0

    def check(replies):
        nonlocal checked
        for reply in replies:
            session = worker.sessions[reply.session_id]
            truth = session.env.ground_truth()
            assert reply.observation.json_text("ground_truth") == json.dumps(truth)
            assert session.truth_texts["walls"][0] is truth["walls"]
            checked += 1

    check(replies)
    for _ in range(12):
        replies = [a.reply for a in worker.handle([Step(s, _responses(rng)[0]) for s in ids])]
        check(replies)
        done = [r.session_id for r in replies if r.done]
        check(worker.handle([Reset(s) for s in done]))
        resets += len(done)
    assert resets >= 3 and checked > 40


@pytest.mark.parametrize("penalty", [0.1, 0.25, "all"])
def test_a_guard_penalty_is_written_over_the_wire_form_as_over_the_fields(penalty):
    """The guard's penalty on a reply still held as its worker's bytes is written over
    them (protobuf's merge), unread; the result is the reply the fields' way gives, on
    both wires. A penalty that brings the reward to zero takes the fields' way (proto3
    can't write a zero over a number)."""
    from env_server.service.assemble import with_penalty

    worker = Worker()
    worker.handle([_mk("s-1", {"env": "sokoban", "seed": 3, "format": "grounding_worldmodeling"})])
    [stepped] = _over_the_pipe(worker.handle([Step("s-1", _responses(random.Random(1))[0])]))
    assert stepped.reply.wire_bytes() is not None
    fields = _from_values(copy.deepcopy(stepped.reply))  # (the copy read, not the reply)
    amount = fields.reward if penalty == "all" else penalty
    assert fields.reward and (penalty == "all" or fields.reward != penalty), fields.reward
    fields = with_penalty(fields, amount)
    merged = with_penalty(stepped.reply, amount)
    assert (merged.wire_bytes() is None) == (penalty == "all")
    assert wire.batch_to_proto([merged]).SerializeToString() == (
        wire.batch_to_proto([fields]).SerializeToString()
    )
    assert merged == fields and merged.reward_parts.penalty == -amount
    assert merged.reward == merged.reward_parts.total
    assert _rest(merged) == _rest(fields)
