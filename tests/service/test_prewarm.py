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
