"""Heavy environments are warmed up when a worker starts, not on a user's first create;
a create that did pay an environment's warm-up says so (info.warm_up_s)."""

from __future__ import annotations

import asyncio

from env_server.service import EnvService, SessionReply, Settings
from env_server.testing import TINY_PATH


def test_prewarmed_env_creates_cold_and_the_other_says_it_paid():
    async def main():
        settings = Settings(
            workers=1,
            envs=["tiny", "sokoban"],
            env_paths={"tiny": TINY_PATH},
            prewarm=["tiny", "frozenlake"],  # frozenlake: not enabled here, so not warmed
        )
        service = EnvService(settings)
        await service.start()  # the worker is Ready before it warms up: it warms behind it
        try:
            assert await service.wait_ready(120) == {"sokoban": True, "tiny": True}
            (worker,) = (await service.health())["workers"]
            assert list(worker["prewarmed"]) == ["tiny"]
            assert isinstance(worker["prewarmed"]["tiny"], float)
            tiny, soko, soko2 = await service.create(
                [{"env": "tiny"}, {"env": "sokoban"}, {"env": "sokoban", "seed": 1}]
            )
            assert all(isinstance(r, SessionReply) for r in (tiny, soko, soko2))
            assert "warm_up_s" not in tiny.info  # warmed at start-up
            assert soko.info["warm_up_s"] > 0  # the first Sokoban in this worker paid it
            assert "warm_up_s" not in soko2.info
            await service.close([r.session_id for r in (tiny, soko, soko2)])
        finally:
            await service.stop()

    asyncio.run(main())


def test_a_prewarmed_navigation_world_renders_its_own_picture():
    """navigation (OpenGL: its context is current in one thread at a time) is warmed on the
    worker's main thread: warmed in the pre-warm thread, its pooled world rendered another
    world's picture in the main thread, and a fork's frames differed from its source's."""
    from env_server.core import registry
    from env_server.service.images import decode_image

    local = registry.load("navigation")()
    expected = local.reset(3).images[0]
    local.close()

    async def main():
        settings = Settings(workers=1, envs=["navigation"], prewarm=["navigation"])
        service = EnvService(settings)
        await service.start()
        try:
            assert await service.wait_ready(120) == {"navigation": True}
            (worker,) = (await service.health())["workers"]
            assert isinstance(worker["prewarmed"]["navigation"], float)
            first, second = await service.create(
                [{"env": "navigation", "seed": 3}, {"env": "navigation", "seed": 3}]
            )
            for reply in (first, second):
                assert isinstance(reply, SessionReply), reply
                assert (decode_image(reply.observation.images[0]) == expected).all()
            await service.close([first.session_id, second.session_id])
        finally:
            await service.stop()

    asyncio.run(main())
