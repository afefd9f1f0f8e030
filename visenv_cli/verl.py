"""`visenv verl-data`: the parquet files verl's trainer reads for the `visenv` agent loop
(clients/verl_agent_loop.py; docs/verl.md lists the row keys).

One row per episode: `agent_name` "visenv", `data_source` "visenv/ENV", a placeholder
`prompt` (the agent loop builds the real one from the session), and in `extra_info` the
episode: env, seed, config and reasoning (JSON text: parquet has no empty structs),
format, representation, max_turns, index, split. Training seeds are those of
`visenv train`'s run seed, validation seeds the held-out ones of `visenv eval`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer


def rows(
    envs: list[str],
    seeds: range | list[int],
    split: str,
    *,
    config: dict[str, Any],
    format: str | None,
    representation: str | None,
    max_turns: int | None,
) -> list[dict[str, Any]]:
    """The dataset rows of these envs' episodes, env by env."""
    out = []
    for env in envs:
        for seed in seeds:
            out.append(
                {
                    "data_source": f"visenv/{env}",
                    "agent_name": "visenv",
                    "prompt": [{"role": "user", "content": f"visenv {env} seed {seed}"}],
                    "ability": "visual_agent",
                    "reward_model": {"style": "visenv", "ground_truth": ""},
                    "extra_info": {
                        "env": env,
                        "seed": int(seed),
                        "config": json.dumps(config),
                        "reasoning": "{}",
                        "format": format,
                        "representation": representation,
                        "max_turns": max_turns,
                        "index": len(out),
                        "split": split,
                    },
                }
            )
    return out


# fmt: off
def verl_data(
    env: Annotated[
        list[str], typer.Option(help="Environment (repeatable), e.g. --env sokoban --env frozenlake.")
    ],
    out: Annotated[Path, typer.Option(help="Folder for train.parquet and validation.parquet.")] = (
        Path("data/visenv")
    ),
    train_size: Annotated[int, typer.Option(min=1, help="Training episodes per env.")] = 1000,
    val_size: Annotated[int, typer.Option(min=1, help="Validation episodes per env.")] = 64,
    seed: Annotated[
        int, typer.Option(min=0, help="Run seed: which training and held-out seeds.")
    ] = 0,
    config: Annotated[str, typer.Option(help="The environments' config, as JSON.")] = "{}",
    format: Annotated[
        str | None, typer.Option(help="Response format.", show_default="the env's")
    ] = None,
    representation: Annotated[
        str | None, typer.Option(help="World-model representation.", show_default="the env's")
    ] = None,
    max_turns: Annotated[
        int | None, typer.Option(min=1, help="Turns per episode.", show_default="the env's")
    ] = None,
) -> None:  # fmt: on
    """Write verl's train/validation parquet files of visenv episodes (agent loop `visenv`)."""
    from clients.eval import eval_level_seeds, train_level_seed

    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        typer.secho("visenv verl-data needs pyarrow: pip install 'visenv[verl]'",
                    fg=typer.colors.RED, err=True)  # fmt: skip
        raise typer.Exit(1) from None
    try:
        env_config = json.loads(config)
        if not isinstance(env_config, dict):
            raise ValueError("it is not a JSON object")
    except ValueError as exc:
        raise typer.BadParameter(f"--config: {exc}") from None
    options = dict(config=env_config, format=format, representation=representation,
                   max_turns=max_turns)  # fmt: skip
    splits = {
        "train": rows(env, [train_level_seed(seed, i) for i in range(train_size)], "train",
                      **options),  # fmt: skip
        "validation": rows(env, eval_level_seeds(seed, val_size), "validation", **options),
    }
    out.mkdir(parents=True, exist_ok=True)
    for split, table in splits.items():
        pq.write_table(pa.Table.from_pylist(table), out / f"{split}.parquet")
        typer.echo(f"wrote {len(table)} episodes to {out / f'{split}.parquet'}")
