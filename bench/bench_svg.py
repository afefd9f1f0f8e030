"""Benchmark of the SVG environment: renders and scores per second.

    .venv/bin/python bench/bench_svg.py [--icons 100] [--size 256]

Prints, for OpenMoji icons at size x size:
- cairosvg in this process (no sandbox), for reference;
- the sandboxed render (checks + persistent render child under RLIMIT_AS and a timeout);
- the cost of starting a render child (what a short-lived child per render would pay);
- the offline score (pixel + SSIM + edge) against a prepared target;
- whole env steps (render + score) with the oracle's and a crude SVG.
"""

from __future__ import annotations

import argparse
import statistics
import time

from env_server.core import Action
from env_server.envs.svg import SvgConfig, SvgEnv, data
from env_server.envs.svg.rasterize import Limits, RenderProcess, check_svg, render_svg
from env_server.envs.svg.render_worker import render_in_process
from env_server.envs.svg.score import DEFAULT_WEIGHTS, OfflineScorer

CRUDE = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 72 72">'
    '<circle cx="36" cy="36" r="23" fill="#FCEA2B" stroke="#000" stroke-width="2"/></svg>'
)


def rate(label: str, count: int, seconds: float) -> None:
    print(f"{label:<44} {count / seconds:8.1f} /s   {1000 * seconds / count:7.2f} ms each")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--icons", type=int, default=100, help="how many OpenMoji icons to use")
    parser.add_argument("--size", type=int, default=256, help="image side in pixels")
    parser.add_argument("--starts", type=int, default=5, help="render-child starts to time")
    args = parser.parse_args()

    icons = data.openmoji_icons()[:: max(1, len(data.openmoji_icons()) // args.icons)][: args.icons]
    sources = [icon.source() for icon in icons]
    limits = Limits()
    size = args.size
    print(
        f"{len(sources)} OpenMoji icons at {size}x{size}, mean {statistics.mean(map(len, sources)):.0f} bytes"
    )

    checked = [check_svg(s, limits) for s in sources]
    start = time.perf_counter()
    for svg in checked:
        render_in_process(svg, size, size)
    rate("cairosvg in-process (no sandbox)", len(checked), time.perf_counter() - start)

    start = time.perf_counter()
    for s in sources:
        check_svg(s, limits)
    rate("checks only (defusedxml pre-parse)", len(sources), time.perf_counter() - start)

    render_svg(sources[0], limits, size, size)  # start the shared render child
    start = time.perf_counter()
    images = [render_svg(s, limits, size, size) for s in sources]
    rate("sandboxed render (checks + render child)", len(sources), time.perf_counter() - start)

    starts = []
    for _ in range(args.starts):
        proc = RenderProcess(limits.memory_mb)
        t0 = time.perf_counter()
        proc.render(checked[0], size, size, timeout_s=60)  # start + one render
        starts.append(time.perf_counter() - t0)
        proc.close()
    print(
        f"{'render child start + first render':<44} {1000 * statistics.median(starts):8.1f} ms (median of {args.starts})"
    )

    scorer = OfflineScorer(dict(DEFAULT_WEIGHTS))
    prepared = [scorer.prepare(img) for img in images]
    crude = render_svg(CRUDE, limits, size, size)
    start = time.perf_counter()
    for p in prepared:
        scorer.score(crude, p)
    rate("offline score (pixel+ssim+edge)", len(prepared), time.perf_counter() - start)

    start = time.perf_counter()
    for img in images:
        scorer.prepare(img)
    rate("target preparation (once per reset)", len(images), time.perf_counter() - start)

    env = SvgEnv(SvgConfig(split="all", image_size=size))
    steps, elapsed = 0, 0.0
    for seed in range(len(sources) // 2):
        env.reset(seed)
        t0 = time.perf_counter()
        done = env.step([Action("svg", payload=CRUDE)]).done
        steps += 1
        if not done:
            env.step(env.oracle_actions())
            steps += 1
        elapsed += time.perf_counter() - t0
    rate("env.step (render + score)", steps, elapsed)
    env.close()


if __name__ == "__main__":
    main()
