"""`ServerContract` checks a running visenv server over its wire protocol (REST and gRPC,
spoken directly: httpx and the generated stub, no SDK), for one environment and config:

    import pytest
    from env_server.testing import ServerContract

    @pytest.fixture(scope="session")
    def server_addresses():                    # transport -> address
        return {"rest": "http://127.0.0.1:8000", "grpc": "127.0.0.1:50051"}

    class TestSokobanServed(ServerContract):
        env = "sokoban"
        config = {}                              # the env's default config
        transports = ("rest", "grpc")            # keys of server_addresses

A transport whose name ends in "rest" speaks REST, any other gRPC (e.g. "gateway" for a
gateway's gRPC port). Each class runs every check once per transport:

- create -> the first observation: its images decode to their stated shape, one
  `<image>` placeholder each, and its ground truth is the one the environment gives
  in-process for the same seed and config;
- the oracle's actions (planned in-process from the same seed) stepped over the wire reach
  success, with step_index, turn and flags as the wire says; get answers the last reply;
  REST's frame.png decodes to the current first image; reset starts episode 1 at step 0
  with the first ground truth again; close, and the session is gone (NOT_FOUND);
- a garbage response is a normal reply with action_valid false, never an error;
- a batch with one bad item (a bad config; an unknown session) answers that item only.

The connections are `wire_client.WireClient`s, deliberately independent of `visenv.wire`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pytest

from env_server.testing.wire_client import WireClient, decode_image


def assert_close_truth(served: Any, local: Any, tolerance: float, where: str = "ground_truth"):
    """Two ground truths are equal, numbers within `tolerance` (0: exactly)."""
    if isinstance(served, dict) and isinstance(local, dict):
        assert served.keys() == local.keys(), f"{where}: keys {sorted(served)} != {sorted(local)}"
        for key in served:
            assert_close_truth(served[key], local[key], tolerance, f"{where}.{key}")
    elif isinstance(served, list) and isinstance(local, list):
        assert len(served) == len(local), f"{where}: {len(served)} items != {len(local)}"
        for n, (a, b) in enumerate(zip(served, local, strict=True)):
            assert_close_truth(a, b, tolerance, f"{where}[{n}]")
    elif (
        isinstance(served, (int, float))
        and isinstance(local, (int, float))
        and not isinstance(served, bool)
    ):
        assert abs(served - local) <= tolerance, f"{where}: {served} != {local} (±{tolerance})"
    else:
        assert served == local, f"{where}: {served!r} != {local!r}"


@dataclass
class OraclePlan:
    """An episode planned in-process: the first ground truth and the oracle's turns."""

    first_truth: dict[str, Any]
    turns: list[list[dict[str, Any]]]  # actions as the wire's JSON


class ServerContract:
    """The server contract for one environment and config (see the module docstring)."""

    env: ClassVar[str]
    config: ClassVar[dict[str, Any]] = {}
    seed: ClassVar[int] = 1
    transports: ClassVar[tuple[str, ...]] = ("rest", "grpc")
    token: ClassVar[str | None] = None
    # numbers of the served ground truth may differ from the in-process one by this much
    # (a physics simulator in another process); 0 for exact environments
    truth_tolerance: ClassVar[float] = 0.0
    max_oracle_turns: ClassVar[int] = 100

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every check runs once per transport (a class-scoped parameter, so each transport
        gets its own connection and one in-process plan serves them all)."""
        super().__init_subclass__(**kwargs)
        cls.pytestmark = [pytest.mark.parametrize("transport", cls.transports, scope="class")]

    # ---- fixtures -------------------------------------------------------------------
    @pytest.fixture(scope="class")
    @classmethod
    def plan(cls) -> OraclePlan:
        """The oracle's episode for (env, config, seed), played in this process."""
        from env_server.core import registry

        env_class = registry.load(cls.env)
        env = env_class(env_class.Config.model_validate(cls.config))
        try:
            obs = env.reset(cls.seed)
            first = copy.deepcopy(obs.ground_truth)
            turns: list[list[dict[str, Any]]] = []
            for _ in range(cls.max_oracle_turns):
                actions = env.oracle_actions()
                turns.append([a.to_json() for a in actions])
                tr = env.step(actions)
                if tr.done:
                    assert tr.success, f"the oracle failed in-process on seed {cls.seed}"
                    break
            else:
                raise AssertionError(f"the oracle needed over {cls.max_oracle_turns} turns")
        finally:
            env.close()
        return OraclePlan(first, turns)

    @pytest.fixture(scope="class")
    @classmethod
    def wire(cls, request: pytest.FixtureRequest, transport: str) -> Iterator[WireClient]:
        """A connection over `transport` to the address the `server_addresses` fixture
        (which the test module provides: transport -> address) gives for it."""
        addresses = request.getfixturevalue("server_addresses")
        client = WireClient.connect(transport, addresses[transport], cls.token)
        yield client
        client.shut()

    # ---- helpers --------------------------------------------------------------------
    def options(self, **extra: Any) -> dict[str, Any]:
        return {"env": self.env, "config": dict(self.config), "seed": self.seed, **extra}

    @staticmethod
    def reply(item: dict[str, Any], what: str) -> dict[str, Any]:
        assert item["ok"], f"{what}: {item.get('error')}"
        return item["reply"]

    def check_reply(self, reply: dict[str, Any], where: str) -> None:
        obs = reply["observation"]
        assert reply["env"] == self.env
        assert obs["text"].count("<image>") == len(obs["images"]), where
        for n, image in enumerate(obs["images"]):
            array = decode_image(image)
            assert array.dtype == np.uint8 and array.ndim == 3, f"{where}: image {n}"
        assert isinstance(obs["ground_truth"], dict) and isinstance(reply["info"], dict)
        parts = reply["reward_parts"]
        total = sum(parts[k] for k in ("env", "format", "observation", "prediction", "penalty"))
        assert math.isclose(reply["reward"], total, abs_tol=1e-6), f"{where}: reward != parts"

    # ---- the checks -----------------------------------------------------------------
    def test_oracle_episode(self, wire: WireClient, plan: OraclePlan) -> None:
        created = self.reply(wire.create([self.options()])[0], "create")
        sid = created["session_id"]
        try:
            self.check_reply(created, "create")
            assert created["step_index"] == created["turn"] == created["episode"] == 0
            assert created.get("system_prompt"), "a create reply carries the system prompt"
            assert_close_truth(
                created["observation"]["ground_truth"], plan.first_truth, self.truth_tolerance
            )
            last = created
            for n, actions in enumerate(plan.turns):
                assert not (last["terminated"] or last["truncated"]), f"ended before turn {n}"
                item = {"session_id": sid, "step_index": n, "actions": actions}
                last = self.reply(wire.step([item])[0], f"step {n}")
                self.check_reply(last, f"step {n}")
                assert last["step_index"] == last["turn"] == n + 1
            assert last["success"] and last["terminated"], "the oracle's actions did not succeed"
            got = self.reply(wire.get([sid])[0], "get")
            assert got["step_index"] == last["step_index"] and got["success"]
            assert got["observation"]["ground_truth"] == last["observation"]["ground_truth"]
            png = wire.frame(sid) if last["observation"]["images"] else None
            if png is not None:
                frame = decode_image({"encoding": "png", "data": png,
                                      "shape": last["observation"]["images"][0]["shape"]})  # fmt: skip
                assert np.array_equal(frame, decode_image(last["observation"]["images"][0])) or (
                    last["observation"]["images"][0]["encoding"] == "jpeg"
                )
            reset = self.reply(wire.reset([{"session_id": sid, "seed": self.seed}])[0], "reset")
            self.check_reply(reset, "reset")
            assert reset["episode"] == 1 and reset["step_index"] == 0
            assert_close_truth(
                reset["observation"]["ground_truth"], plan.first_truth, self.truth_tolerance
            )
        finally:
            closed = wire.close([sid])[0]
        assert closed["ok"], closed
        gone = wire.get([sid])[0]
        assert not gone["ok"] and gone["error"]["code"] == "NOT_FOUND", gone

    def test_garbage_response_is_a_reply_not_an_error(self, wire: WireClient) -> None:
        sid = self.reply(wire.create([self.options()])[0], "create")["session_id"]
        try:
            item = {"session_id": sid, "step_index": 0, "response": "no tags <answer>%%%"}
            reply = self.reply(wire.step([item])[0], "step")
            assert reply["info"]["action_valid"] is False
            assert reply["reward_parts"]["format"] <= 0
        finally:
            wire.close([sid])

    def test_batch_with_one_bad_item(self, wire: WireClient, plan: OraclePlan) -> None:
        bad_config = {**self.config, "max_turns": 0}
        created = wire.create([self.options(), self.options(config=bad_config)])
        sid = self.reply(created[0], "create")["session_id"]
        try:
            error = created[1]
            assert not error["ok"] and error["error"]["code"] == "INVALID_ARGUMENT", error
            assert error["error"]["field"] == "config.max_turns", error
            steps = wire.step([
                {"session_id": sid, "step_index": 0, "actions": plan.turns[0]},
                {"session_id": "s-0000000000000000", "step_index": 0, "actions": plan.turns[0]},
            ])  # fmt: skip
            self.check_reply(self.reply(steps[0], "the good step"), "step")
            assert not steps[1]["ok"] and steps[1]["error"]["code"] == "NOT_FOUND"
        finally:
            wire.close([sid])
