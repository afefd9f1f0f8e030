"""`visenv train CONFIG [key=value ...]`: PPO / Bi-Level GAE from a YAML config.

    visenv train examples/train_sokoban_tiny.yaml ppo.iterations=5 run.out_dir=runs/try
    torchrun --nproc_per_node 2 -m trainer.cli examples/train_sokoban_tiny.yaml

A config error (an unknown or ill-typed key) stops before anything
starts, naming the key. Re-running with the same `run.out_dir` resumes from its last checkpoint.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from .config import ConfigError, load_config

app = typer.Typer(add_completion=False, help=__doc__)


def train(
    config_path: str | Path | None, overrides: list[str] | None = None, say: bool = False
) -> list[dict]:
    """Load, validate and run a training config; returns the per-iteration metrics.
    `say`: print the output directory first (where metrics, checkpoints, episodes go)."""
    cfg = load_config(config_path, overrides)
    if say:
        typer.echo(f"output directory: {cfg.run.out_dir}")
    from .ppo import train as run

    return run(cfg).history


@app.command()
def main_command(
    config: Annotated[
        Path, typer.Argument(help="YAML training config, e.g. examples/train_sokoban_tiny.yaml")
    ],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="overrides: section.key=value")
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="log every iteration's metrics")
    ] = False,
) -> None:
    """Train a policy with PPO (or GRPO) on episodes played against visenv servers.

    The YAML config names the servers, the environment, the model and the PPO settings (docs/trainer.md).

    Example configs: examples/train_sokoban_tiny.yaml (a tiny random model on CPU, minutes), examples/train_vicrit_unary.yaml (vicrit with unary feedback), examples/train_frozenlake_qwen3b.yaml (Qwen2.5-VL-3B on a GPU).

    Metrics, checkpoints and sampled episodes go to run.out_dir; a run started again with the same run.out_dir resumes after its last checkpoint."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        history = train(config, overrides or [], say=True)
    except ConfigError as exc:
        typer.secho(str(exc), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    if history:
        last = history[-1]
        typer.echo(
            f"done: {len(history)} iterations; last reward {last.get('reward', float('nan')):.3f}, "
            f"success {last.get('success', float('nan')):.2f}; "
            f"metrics, checkpoints and episodes in {load_config(config, overrides or []).run.out_dir}"
        )


def main() -> None:
    app()


if __name__ == "__main__":
    main()
