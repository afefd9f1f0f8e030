"""The `visenv` command line: serve the environments, list them, train.

The highest layer: it imports the server (env_server/), the SDK (clients/) and the
trainer; nothing imports it. `visenv/` below everything holds only the wire contract.

visenv serve --port 8000 --grpc-port 50051 --workers 2
visenv envs
visenv train CONFIG          (provided by trainer/cli.py)
visenv eval --server 127.0.0.1:50051 --endpoint http://127.0.0.1:8001/v1 --model NAME
visenv levels sokoban --seeds 0:200 --out levels.jsonl [--policy random --server HOST:PORT]
visenv verl-data --env sokoban --env frozenlake --out data/visenv   (visenv_cli/verl.py)
visenv ray up --name envs --servers 4 --cpus-per-server 2           (visenv_cli/ray.py)
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import sys
from collections.abc import Iterator
from typing import Annotated

import typer
import typer.core

from visenv_cli.ray import ray_app
from visenv_cli.verl import verl_data


def _flag_type(self: typer.core.TyperOption, ctx: typer.core._click.Context) -> str | None:
    """A flag takes no value: --help shows no type for it (typer 0.29 labels it <bool>)."""
    return None if self.is_flag else _option_type(self, ctx)


_option_type = typer.core.TyperOption.display_type_rich
typer.core.TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]

app = typer.Typer(
    help="visenv: visual environments for multi-turn RL of vision-language agents.",
    no_args_is_help=True,
    add_completion=False,
)


@contextlib.contextmanager
def _server_extra(command: str) -> Iterator[None]:
    """A client-only install (`pip install visenv`) has no server: say which extra brings it."""
    try:
        yield
    except ModuleNotFoundError as exc:
        typer.secho(
            f"visenv {command} needs the server, which this install lacks (no module "
            f"{exc.name!r}): pip install 'visenv[server]'",
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(1) from None


@app.command()
# fmt: off
def serve(
    host: Annotated[
        str | None,
        typer.Option(
            help="Address to listen on; 0.0.0.0 for every interface.",
            show_default="127.0.0.1",
        ),
    ] = None,
    port: Annotated[
        int | None,
        typer.Option(
            help="HTTP port (REST API, /docs, /play, /metrics); 0 picks a free one.",
            show_default="8000",
        ),
    ] = None,
    grpc_port: Annotated[
        int | None,
        typer.Option(
            help="gRPC port; 0 picks a free one.",
            show_default="50051",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Worker processes holding the environments.",
            show_default="one per CPU core",
        ),
    ] = None,
    envs: Annotated[
        str | None,
        typer.Option(
            help="Environments to enable, comma-separated, e.g. sokoban,frozenlake (see `visenv envs`).",
            show_default="every one that can run here",
        ),
    ] = None,
    idle_timeout: Annotated[
        float | None,
        typer.Option(
            help="Close sessions idle for this many seconds (0: never).",
            show_default="600",
        ),
    ] = None,
    max_sessions: Annotated[
        int | None,
        typer.Option(
            help="Most open sessions; creating more answers CAPACITY (HTTP 429).",
            show_default="4096",
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            help="Require 'Authorization: Bearer TOKEN' on every call but /health (REST and gRPC).",
            envvar="VISENV_TOKEN",
            show_default="none",
        ),
    ] = None,
    upstream: Annotated[
        list[str] | None,
        typer.Option(
            help="Gateway mode (repeatable): run no environments here, route sessions to the "
            "visenv server at HOST:GRPC_PORT; a name that resolves to many replicas adds them all.",
            show_default="none",
        ),
    ] = None,
    vagen_legacy: Annotated[
        bool | None,
        typer.Option(
            "--vagen-legacy",
            help="Also serve VAGEN's legacy batch API at /compat/vagen-legacy. Its client sends "
            "no credentials, so those routes take no token: only on a trusted network.",
            show_default="off",
        ),
    ] = None,
    coalesce_window: Annotated[
        float | None,
        typer.Option(
            help="Under concurrent single-session traffic, seconds a request waits for others "
            "to share its message to a worker (0: never); a lone client never waits.",
            show_default="0.01",
        ),
    ] = None,
    coalesce_max_items: Annotated[
        int | None,
        typer.Option(
            help="Most items in one coalesced message to a worker (1: no coalescing).",
            show_default="512",
        ),
    ] = None,
) -> None:  # fmt: on
    """Serve every enabled environment over HTTP and gRPC from one process.

    Options not given come from VISENV_* environment variables (VISENV_PORT,
    VISENV_WORKERS, ...), then the defaults. Prints the HTTP, gRPC, docs and play
    addresses; stop with Ctrl-C.
    """
    with _server_extra("serve"):
        from pydantic import ValidationError

        from env_server.api.app import serve as run_server
        from env_server.service.settings import Settings

    given = {
        "host": host,
        "port": port,
        "grpc_port": grpc_port,
        "workers": workers,
        "envs": envs,
        "idle_timeout": idle_timeout,
        "max_sessions": max_sessions,
        "token": token,
        "upstreams": upstream or None,
        "vagen_legacy": vagen_legacy,
        "coalesce_window": coalesce_window,
        "coalesce_max_items": coalesce_max_items,
    }
    try:
        settings = Settings(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise typer.BadParameter(f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    try:
        asyncio.run(run_server(settings))
    except (ValueError, OSError, RuntimeError) as exc:  # unknown env, port in use, ...
        typer.secho(f"visenv serve: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None


@app.command("envs")
def list_envs() -> None:
    """List the registered environments and whether each can run on this machine."""
    with _server_extra("envs"):
        from env_server.core import registry

    for name in registry.names():
        try:
            info = registry.info(name)
        except Exception as exc:  # a broken environment module must not hide the others
            typer.echo(f"{name:16} broken       {type(exc).__name__}: {exc}")
            continue
        state = "available" if info.unavailable is None else "unavailable"
        desc = (info.cls.description if info.cls is not None else "") or ""
        reason = f"  ({info.unavailable})" if info.unavailable else ""
        typer.echo(f"{name:16} {state:12} {desc}{reason}")


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def train(ctx: typer.Context) -> None:
    """Train a policy with PPO / Bi-Level GAE from a YAML config.

    visenv train CONFIG [section.key=value ...]: see docs/trainer.md, and visenv train
    --help for its options."""
    try:
        module = importlib.import_module("trainer.cli")
    except ImportError as exc:
        typer.secho(f"visenv train is not available here: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None
    entry = getattr(module, "main", None) or getattr(module, "app", None)
    if entry is None:
        typer.secho("trainer.cli has no `main` or `app` to run", fg=typer.colors.RED, err=True)
        raise typer.Exit(1)
    sys.argv = ["visenv train", *ctx.args]
    entry()


def _config_option(text: str) -> dict:
    """An environment config given on the command line as a JSON object."""
    import json

    try:
        value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise typer.BadParameter(f"--config must be a JSON object: {exc}") from None
    return value


@app.command("eval")
# fmt: off
def eval_model(
    server: Annotated[
        list[str],
        typer.Option(
            help="A visenv server (repeatable): its gRPC address HOST:GRPC_PORT (visenv serve's "
            "--grpc-port, 50051 by default), or http://HOST:PORT for REST (--port, 8000)."
        ),
    ],
    env: Annotated[str, typer.Option(help="Environment name (see `visenv envs`).")] = "sokoban",
    policy: Annotated[
        str,
        typer.Option(
            help="openai: the model at --endpoint/--model; random: uniform moves (discrete "
            "actions); oracle: the environment's own expert. random and oracle need no model "
            "and answer in no_think."
        ),
    ] = "openai",
    endpoint: Annotated[
        str | None,
        typer.Option(help="OpenAI-compatible API root, e.g. http://127.0.0.1:8001/v1 (vLLM)."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="The served model name.")] = None,
    config: Annotated[
        str,
        typer.Option(
            help=('The environment\'s config as JSON, e.g. \'{"feedback": "unary"}\' for vicrit.')
        ),
    ] = "{}",
    episodes: Annotated[int, typer.Option(min=1, max=1_000_000, help="Episodes.")] = 32,
    seed: Annotated[
        int,
        typer.Option(
            min=0,
            max=999,
            help=(
                "Evaluation seed: held-out levels 1e9 + seed*1e6 + i, disjoint from the levels of "
                "every training run (run.seed s trains on s*1e6 + i)."
            ),
        ),
    ] = 0,
    first_level: Annotated[
        int | None,
        typer.Option(
            min=0,
            help=(
                "Play the raw level seeds FIRST_LEVEL .. FIRST_LEVEL+N-1 instead (e.g. a training "
                "run's own levels)."
            ),
            show_default="the held-out range of --seed",
        ),
    ] = None,
    format: Annotated[
        str | None,
        typer.Option(
            help="Response format, e.g. grounding_worldmodeling.", show_default="the env's"
        ),
    ] = None,
    representation: Annotated[
        str | None,
        typer.Option(help="Observation representation, e.g. natural.", show_default="the env's"),
    ] = None,
    max_turns: Annotated[
        int | None, typer.Option(min=1, help="Turns per episode.", show_default="the env's limit")
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes at once.")] = 16,
    transport: Annotated[
        str,
        typer.Option(
            help="grpc or http: the protocol of --server addresses without grpc:// or http://."
        ),
    ] = "grpc",
    temperature: Annotated[
        float, typer.Option(min=0.0, help="Sampling temperature of the model (0: greedy).")
    ] = 0.0,
    max_tokens: Annotated[int, typer.Option(min=1, help="Tokens per answer.")] = 512,
    timeout: Annotated[float, typer.Option(help="Seconds per model request.")] = 120.0,
    retries: Annotated[int, typer.Option(min=0, help="Retries on 429/5xx/connection errors.")] = 3,
    api_key_env: Annotated[
        str, typer.Option(help="Environment variable with the endpoint's API key.")
    ] = "OPENAI_API_KEY",
    out: Annotated[
        str | None,
        typer.Option(
            help=(
                "Write the episodes here: an episode file (one JSON line per episode with every "
                "turn's images, response and rewards) that /play opens."
            )
        ),
    ] = None,
) -> None:  # fmt: on
    """Evaluate a model (or a random or oracle baseline: --policy) on held-out levels.

    The model is served behind an OpenAI-compatible endpoint (--endpoint, --model).

    Prints progress (a bar on a terminal, lines when piped), then the success rate, return,
    reward parts, valid actions, world-model scores and failed episodes (with the cause of
    each error code), and where --out was written. Exits 1 if every episode failed."""
    from clients.eval import eval_level_seeds, run_eval

    env_config = _config_option(config)
    chosen, name, format = _eval_policy(
        policy, env, env_config, server, format, endpoint, model,
        dict(api_key_env=api_key_env, temperature=temperature, max_tokens=max_tokens,
             timeout=timeout, max_concurrency=concurrency, retries=retries),
    )  # fmt: skip
    try:
        _, summary = run_eval(
            server, chosen, env,
            eval_level_seeds(seed, episodes) if first_level is None
            else range(first_level, first_level + episodes),
            out, name=name, transport=transport,
            format=format, representation=representation, max_turns=max_turns,
            concurrency=concurrency, config=env_config,
        )  # fmt: skip
    except Exception as exc:  # no server reachable, unknown env, ...
        typer.secho(f"visenv eval: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None
    if summary.failed == summary.episodes:
        raise typer.Exit(1)


def _eval_policy(
    policy: str, env: str, config: dict, servers: list[str], format: str | None,
    endpoint: str | None, model: str | None, openai_options: dict,
) -> tuple[object, str, str | None]:  # fmt: skip
    """`visenv eval --policy`: the policy, its name in the summary, and the format."""
    if policy == "openai":
        if not (endpoint and model):
            raise typer.BadParameter("--policy openai needs --endpoint and --model "
                                     "(or --policy random / oracle: no model)")  # fmt: skip
        from clients.openai_policy import OpenAIPolicy

        return OpenAIPolicy(endpoint, model, **openai_options), model, format
    if policy not in ("random", "oracle"):
        raise typer.BadParameter(f"--policy must be openai, random or oracle, not {policy!r}")
    if format not in (None, "no_think"):
        raise typer.BadParameter(f"--policy {policy} answers in no_think, not {format}")
    try:
        if policy == "oracle":
            with _server_extra("eval --policy oracle"):
                from visenv_cli.policies import OraclePolicy
            return OraclePolicy(env, config), "oracle", "no_think"
        from clients import EnvClient
        from visenv_cli.policies import RandomPolicy

        with EnvClient(servers) as client:
            spec = next((s for s in client.list_envs() if s.name == env), None)
        if spec is None:
            raise ValueError(f"no server offers {env!r}")
        return RandomPolicy(spec.action_space or {}), "random", "no_think"
    except typer.Exit:
        raise
    except Exception as exc:  # unknown env, bad config, no server, non-discrete actions
        typer.secho(f"visenv eval: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None


@app.command("levels")
# fmt: off
def levels_command(
    env: Annotated[str, typer.Argument(help="Environment name (see `visenv envs`).")],
    seeds: Annotated[str, typer.Option(help="Level seeds A:B (A included, B not).")],
    out: Annotated[str, typer.Option(help="The level file to write (JSON lines).")] = (
        "levels.jsonl"
    ),
    config: Annotated[str, typer.Option(help="The environment's config, as JSON.")] = "{}",
    server: Annotated[
        list[str] | None,
        typer.Option(help="visenv server HOST:PORT for a policy's tries (repeatable)."),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            help="Measure a policy's success too: 'random' (uniform moves, a baseline), "
            "'endpoint' (--endpoint/--model) or 'local' (--model-path)."
        ),
    ] = None,
    endpoint: Annotated[str | None, typer.Option(help="OpenAI-compatible API root.")] = None,
    model: Annotated[str | None, typer.Option(help="The served model name.")] = None,
    model_path: Annotated[str | None, typer.Option(help="A local Hugging Face model.")] = None,
    tries: Annotated[int, typer.Option(min=1, help="The policy's tries per level (K).")] = 8,
    format: Annotated[
        str | None,
        typer.Option(help="Response format.", show_default="no_think for random, else the env's"),
    ] = None,
    max_turns: Annotated[int | None, typer.Option(min=1, help="Turns per try.")] = None,
    temperature: Annotated[
        float, typer.Option(min=0.0, help="Sampling temperature of the model's tries.")
    ] = 1.0,
    success_min: Annotated[float, typer.Option(help="Selection: lowest success rate.")] = 0.1,
    success_max: Annotated[float, typer.Option(help="Selection: highest success rate.")] = 0.7,
) -> None:  # fmt: on
    """Score levels by difficulty (ThinkLite-VL) and write them to a level file.

    The oracle's solution length and, with a policy, its success over K tries; prints the
    difficulty histograms of all the levels and of those a trainer with
    ppo.level_success_min/max would select."""

    from trainer import levels as lv

    try:
        first, _, last = seeds.partition(":")
        seed_range = range(int(first), int(last))
    except ValueError as exc:
        raise typer.BadParameter(f"--seeds must be A:B: {exc}") from None
    env_config = _config_option(config)
    try:
        found = [lv.Level(env, s, _oracle_length(env, env_config, s)) for s in seed_range]
    except Exception as exc:  # an unknown env or a bad config
        typer.secho(f"visenv levels: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1) from None
    if policy is not None:
        if not server:
            raise typer.BadParameter("a policy's tries need --server")
        from clients import EnvClient

        with EnvClient(server) as client:
            spec = next(s for s in client.list_envs() if s.name == env)
            if policy == "random":
                chosen: object = lv.RandomPolicy(spec.action_space or {})
                format = format or "no_think"
            elif policy == "endpoint" and endpoint and model:
                from clients.openai_policy import OpenAIPolicy

                chosen = OpenAIPolicy(endpoint, model, temperature=temperature)
            elif policy == "local" and model_path:
                from trainer.model import load_policy
                from trainer.rollout import HFPolicy
                from trainer.trajectory import ChatLayout

                hf, processing = load_policy(model_path)
                chosen = HFPolicy(hf, ChatLayout(processing), temperature=max(temperature, 1e-3),
                                  max_new_tokens=200, batch_size=16)  # fmt: skip
            else:
                raise typer.BadParameter(
                    "--policy random | endpoint (with --endpoint, --model) | local (--model-path)"
                )
            found = lv.measure_success(
                client.run_episodes, chosen, found, tries, config=env_config, format=format,
                max_turns=max_turns, progress=False,
            )  # fmt: skip
    lv.write_levels(out, found)
    columns = {"all levels": lv.histogram(level.oracle_length for level in found)}
    if policy is not None:
        kept = lv.select_levels(found, success_min, success_max)
        columns[f"success {success_min}..{success_max}"] = lv.histogram(
            level.oracle_length for level in kept
        )
        typer.echo(f"{len(kept)} of {len(found)} levels have a success rate within "
                   f"[{success_min}, {success_max}]")  # fmt: skip
    typer.echo(f"wrote {len(found)} levels to {out}; oracle solution length (actions):")
    typer.echo(lv.format_histograms(columns))


def _oracle_length(env: str, config: dict, seed: int) -> int | None:
    """Actions the environment's oracle takes from the start of level `seed` to success
    (None if it does not succeed within the episode's turns)."""
    from env_server.core import registry

    cls = registry.load(env)
    instance = cls(cls.Config.model_validate(config))
    try:
        instance.reset(seed)
        actions = 0
        while True:
            transition = instance.step(instance.oracle_actions())
            actions += transition.actions_executed
            if transition.done:
                return actions if transition.success else None
    finally:
        instance.close()


app.command("verl-data")(verl_data)
app.add_typer(ray_app, name="ray")


def main() -> None:
    app()
