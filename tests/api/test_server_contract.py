"""The server contract suite (env_server.testing.ServerContract) over everything we ship:
every environment's DEFAULT config over REST, gRPC and a gateway in front of the server,
and every task variant over REST and gRPC, against real `visenv serve` processes.

One server holds every environment (2 workers); the gateway routes to it over gRPC.
"""

from __future__ import annotations

import pytest

from env_server.testing import ServerContract

ALL = ("rest", "grpc", "gateway_rest", "gateway")  # the gateway over both of its transports
BOTH = ("rest", "grpc")


@pytest.fixture(scope="session")
def server_addresses():
    from env_server.testing.launcher import launch_server

    server = launch_server(envs=None, workers=2, timeout=180)
    try:
        gateway = launch_server(envs=None, upstreams=[server.grpc], timeout=120)
    except BaseException:
        server.stop()
        raise
    yield {
        "rest": server.url,
        "grpc": server.grpc,
        "gateway_rest": gateway.url,
        "gateway": gateway.grpc,
    }
    gateway.stop()
    server.stop()


# ---- every environment's default config, over every transport --------------------------
class TestSokobanDefault(ServerContract):
    env = "sokoban"
    transports = ALL


class TestFrozenLakeDefault(ServerContract):
    env = "frozenlake"
    transports = ALL


class TestNavigationDefault(ServerContract):
    env = "navigation"
    transports = ALL


class TestPrimitiveSkillDefault(ServerContract):
    env = "primitive_skill"
    transports = ALL
    truth_tolerance = 2.0  # mm: the physics runs in another process


class TestSvgDefault(ServerContract):
    env = "svg"
    transports = ALL


class TestVicritDefault(ServerContract):
    env = "vicrit"
    transports = ALL


# ---- every variant, over REST and gRPC ---------------------------------------------------
def variant(env: str, config: dict, **attrs) -> type[ServerContract]:
    name = "_".join(str(v) for v in config.values())
    return type(
        f"Test_{env}_{name}",
        (ServerContract,),
        {"env": env, "config": config, "transports": BOTH, **attrs},
    )


TestPlaceTwoCube = variant("primitive_skill", {"task": "PlaceTwoCube"}, truth_tolerance=2.0)
TestStackThreeCube = variant("primitive_skill", {"task": "StackThreeCube"}, truth_tolerance=2.0)
TestPutAppleInDrawer = variant("primitive_skill", {"task": "PutAppleInDrawer"}, truth_tolerance=2.0)
TestNavigationCommonSense = variant("navigation", {"task_set": "common_sense"})
TestNavigationComplexInstruction = variant("navigation", {"task_set": "complex_instruction"})
TestNavigationVisualAppearance = variant("navigation", {"task_set": "visual_appearance"})
TestNavigationLongHorizon = variant("navigation", {"task_set": "long_horizon"})
TestSokobanBigRoomTwoBoxes = variant("sokoban", {"dim_room": [8, 8], "num_boxes": 2})
TestFrozenLakeSix = variant("frozenlake", {"size": 6})
TestFrozenLakeText = variant("frozenlake", {"render_mode": "text"})
TestSvgUnaryFeedback = variant("svg", {"feedback": "unary"})
TestVicritUnaryFeedback = variant("vicrit", {"feedback": "unary"})
