"""Parse-only micro-bench: CPU per `parse_response` call on the reference workload's
responses (Sokoban's action space, two moves a turn, `bench_transport.py`'s response
text), for every paper format, and the layout check alone (`_split_sections`) next to
the tag walk it falls back to (`_walk_sections`, the check before issue 28's fast path).

    python bench/bench_parse.py [--calls 20000] [--repeat 5]

Prints microseconds per call, the best of `--repeat` runs (the least disturbed by a
loaded machine).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from env_server.core.types import ResponseFormat  # noqa: E402
from env_server.envs.sokoban.env import SokobanEnv  # noqa: E402
from env_server.reasoning import formats  # noqa: E402

MOVES = ("Up", "Down", "Left", "Right")
GRID = "######\n#_P__#\n#_X__#\n#__O_#\n#____#\n######"
REASONING = "The box is below me; I move around it."


def response(fmt: ResponseFormat, rng: random.Random) -> str:
    """A well-formed response in `fmt` like the reference workload's."""
    parts = {"observation": GRID, "reasoning": REASONING, "prediction": GRID}
    sections = formats.SECTIONS[fmt]
    answer = f"<answer>{', '.join(rng.choice(MOVES) for _ in range(2))}</answer>"
    if sections == ():
        return answer
    inner = REASONING if sections is None else "".join(f"<{s}>{parts[s]}</{s}>" for s in sections)
    return f"<think>{inner}</think>{answer}"


def best_us(fn, texts: list[str], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.process_time()
        for text in texts:
            fn(text)
        times.append(time.process_time() - start)
    return min(times) / len(texts) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    space = SokobanEnv().action_space
    rng = random.Random(0)
    walk = getattr(formats, "_walk_sections", formats._split_sections)
    print(f"{'format':<26}{'parse_response':>16}{'_split_sections':>17}{'tag walk':>10}  (us/call)")
    for fmt in formats.SECTIONS:
        texts = [response(fmt, rng) for _ in range(args.calls)]
        assert formats.parse_response(texts[0], fmt, space).format_ok
        full = best_us(lambda t, f=fmt: formats.parse_response(t, f, space), texts, args.repeat)
        split = best_us(lambda t, f=fmt: formats._split_sections(t, f), texts, args.repeat)
        walked = best_us(lambda t, f=fmt: walk(t, f), texts, args.repeat)
        print(f"{fmt.value:<26}{full:>16.2f}{split:>17.2f}{walked:>10.2f}")


if __name__ == "__main__":
    main()
