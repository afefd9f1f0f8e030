"""SVG reconstruction: the agent sees a target icon and writes SVG code that reproduces it.

Each turn the agent answers with one SVG document. It is checked and rasterised in a
sandboxed render process (see `rasterize.py`), scored against the target (see `score.py`),
and shown beside the target on the next turn (see `render.py`). The turn's reward is the
score, in [0, 1]; the episode ends with success when the score reaches
`success_threshold`, or is truncated after `max_turns` turns. An SVG that is refused or
fails to render is an invalid action (reward 0, the reason in `invalid_actions`); the
episode goes on.

There is no object state, so the ground truth is the icon id, its description, the
turn and the last score. Spatial world-model grading does not apply (`grading = None`);
`grade_description` grades an `<observation>`/`<prediction>` by the words of the icon's
description it names instead (see `grading.py`). The expert (`oracle.py`) answers with
the target's own source.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, ValidationInfo, field_validator

from env_server.core import (
    IMAGE_PLACEHOLDER,
    Action,
    ActionKind,
    ActionSpace,
    EnvConfig,
    EnvError,
    Environment,
    Observation,
    Representation,
    ResponseFormat,
    StatePrompt,
    Transition,
)
from env_server.core.env import no_episode
from env_server.core.spatial import GradingSpec

from .._feedback import Attempts, FeedbackConfig, feedback_observation
from . import data, grading, oracle, render
from .rasterize import InvalidSvg, Limits
from .score import DEFAULT_WEIGHTS, DreamSimScorer, OfflineScorer, Scorer, dreamsim_dir

ACTION = "svg"


def _document_key(svg: str) -> str:
    """An SVG document with its layout whitespace folded, to tell a repeated answer."""
    return " ".join(re.sub(r">\s+<", "><", svg).split())


class SvgConfig(FeedbackConfig):
    """Options of the SVG environment. By default targets are OpenMoji's colour emoji.

    `feedback: "unary"` (UFO, see `envs/_feedback.py`): an answer below the success
    threshold is followed only by "Let's try again." (no rendering, no score), for up to
    `max_attempts` answers; the reward decays with the attempt, repeats are penalised.
    """

    max_turns: int = Field(2, ge=1, le=1000, description="Turns before the episode is truncated.")
    image_size: int = Field(256, ge=32, le=1024, description="Side of the rendered images, pixels.")
    svg_dir: str | None = Field(None, description="Use the *.svg files of this folder as targets.")
    jsonl_path: str | None = Field(
        None, description='Use a JSONL file of {"svg", "id"?, "description"?} objects as targets.'
    )
    split: Literal["train", "test", "all"] = Field("train", description="Which split of the icons.")
    test_fraction: float = Field(
        0.1, ge=0.0, le=1.0, description="Share of icons in the test split."
    )
    split_seed: int = Field(
        0, description="Seed of the train/test split (a hash of seed and icon id)."
    )
    similarity: Literal["offline", "dreamsim"] = Field(
        "offline", description="offline: pixel/SSIM/edge score; dreamsim: 1 - DreamSim distance."
    )
    score_weights: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_WEIGHTS),
        description="Weights of the offline score parts: pixel, ssim, edge.",
    )
    dreamsim_dir: str | None = Field(
        None,
        description="Folder with DreamSim weights (default $VISENV_DREAMSIM_DIR or ~/.cache/dreamsim).",
    )
    dreamsim_device: str = Field("cpu", description="Torch device for DreamSim.")
    success_threshold: float = Field(
        0.9, ge=0.0, le=1.0, description="Score that counts as success."
    )
    max_svg_bytes: int = Field(100_000, ge=100, le=10_000_000, description="Largest SVG accepted.")
    max_depth: int = Field(64, ge=2, le=1000, description="Deepest element nesting accepted.")
    max_elements: int = Field(10_000, ge=1, le=1_000_000, description="Most elements accepted.")
    render_timeout_s: float = Field(
        5.0, gt=0.0, le=120.0, description="Wall-clock limit of one render."
    )
    render_memory_mb: int = Field(
        512, ge=64, le=16_384, description="Memory limit of the render process."
    )

    @field_validator("jsonl_path")
    @classmethod
    def _one_source(cls, jsonl_path: str | None, info: ValidationInfo) -> str | None:
        if jsonl_path and info.data.get("svg_dir"):  # a field validator: the error names a field
            raise ValueError("give svg_dir or jsonl_path, not both")
        return jsonl_path

    def limits(self) -> Limits:
        return Limits(
            max_bytes=self.max_svg_bytes,
            max_depth=self.max_depth,
            max_elements=self.max_elements,
            timeout_s=self.render_timeout_s,
            memory_mb=self.render_memory_mb,
        )


@dataclass
class Episode:
    icon: data.Icon
    target_svg: str
    target: np.ndarray
    prepared: Any  # the scorer's view of the target
    last_image: np.ndarray | None = None
    last_score: float | None = None
    last_error: str | None = None
    success: bool = False
    attempts: Attempts = field(default_factory=Attempts)  # the answers, for unary feedback


class SvgEnv(Environment):
    name: ClassVar[str] = "svg"
    Config: ClassVar[type[EnvConfig]] = SvgConfig
    description: ClassVar[str] = (
        "SVG reconstruction: write SVG code that reproduces a target icon (OpenMoji by default)."
    )
    grading: ClassVar[GradingSpec | None] = None  # no object state: grade_description instead

    config: SvgConfig

    def __init__(self, config: SvgConfig | None = None) -> None:
        super().__init__(config)
        cfg = self.config
        if cfg.svg_dir:
            icons = data.folder_icons(cfg.svg_dir)
        elif cfg.jsonl_path:
            icons = data.jsonl_icons(cfg.jsonl_path)
        else:
            icons = data.openmoji_icons()
        self.icons = data.select(icons, cfg.split, cfg.split_seed, cfg.test_fraction)
        self.limits = cfg.limits()
        self.scorer: Scorer
        if cfg.similarity == "dreamsim":
            self.scorer = DreamSimScorer(dreamsim_dir(cfg.dreamsim_dir), cfg.dreamsim_device)
        else:
            self.scorer = OfflineScorer(dict(cfg.score_weights))
        self._ep: Episode | None = None

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            import cairosvg  # noqa: F401  (needs the system library libcairo2)
        except (ImportError, OSError) as exc:
            return f"cairosvg cannot be loaded ({exc}); install libcairo2 and pip install 'visenv[svg]'"
        return None

    @classmethod
    def action_space_for(cls, config: EnvConfig) -> ActionSpace:
        return ActionSpace(
            kind=ActionKind.DOCUMENT,
            names=(ACTION,),
            max_per_turn=1,
            description="One complete SVG document (<svg ...>...</svg>) that reproduces the target image.",
        )

    # ---- episode --------------------------------------------------------
    def _reset(self, seed: int) -> Observation:
        rng = np.random.default_rng(seed)
        icon = self.icons[int(rng.integers(len(self.icons)))]
        target_svg = icon.source(self.config.max_svg_bytes)
        try:
            target = self._picture(target_svg)
        except InvalidSvg as exc:
            raise EnvError(
                f"target icon {icon.id!r} cannot be rendered: {exc}", code="INVALID_ARGUMENT"
            ) from exc
        self._ep = Episode(icon, target_svg, target, self.scorer.prepare(target))
        return self._observation(done=False)

    def _apply(self, actions: list[Action]) -> Transition:
        ep = self._episode()
        score: float | None = None
        parts: dict[str, float] = {}
        if not actions:
            error = "the answer holds no SVG document"
        else:
            action = actions[0]  # the base class cut the turn to one answer
            error = self._check_action(action)
            if error is None:
                try:
                    image = self._picture(action.payload or "")
                except InvalidSvg as exc:
                    error = str(exc)
                else:
                    score, parts = self.scorer.score(image, ep.prepared)
                    ep.last_image = image
        invalid: list[str] = []
        if error is not None:
            error = error.replace(IMAGE_PLACEHOLDER, "[image]")  # it may quote the agent's text
            invalid.append(f"{ACTION}: {error}")
            ep.last_image = None
        ep.last_score, ep.last_error = score, error
        ep.success = score is not None and score >= self.config.success_threshold
        payload = actions[0].payload if actions and error is None else None
        # the answers allowed are max_turns (= max_attempts under unary feedback): the
        # attempt's own truncation is the base class's max_turns truncation
        attempt = ep.attempts.record(
            self.config,
            key=_document_key(payload) if payload else None,
            correct=ep.success,
            base_reward=float(score or 0.0),
        )
        if self.config.unary and not ep.success:
            observation = feedback_observation(self.config, self.ground_truth())
        else:
            observation = self._observation(done=attempt.done)
        return Transition(
            observation=observation,
            reward=attempt.reward,
            terminated=ep.success,
            truncated=attempt.truncated,
            success=ep.success,
            actions_executed=int(score is not None),
            invalid_actions=invalid,
            info={"score": score, "score_parts": parts, "render_error": error, **attempt.info()},
        )

    def _oracle(self) -> list[Action]:
        return oracle.oracle_actions(self.action_space, self._episode().target_svg)

    def render_answer(self, action: Action) -> np.ndarray | None:
        """The agent's SVG rasterised as it would be scored (image_size x image_size RGB);
        None when the answer is not an SVG document or is refused or fails to render."""
        if self._check_action(action) is not None:
            return None
        try:
            return self._picture(action.payload or "")
        except InvalidSvg:
            return None

    # ---- ground truth and text -------------------------------------------
    def ground_truth(self) -> dict[str, Any]:
        ep = self._episode()
        return {
            "icon_id": ep.icon.id,
            "description": ep.icon.description,
            "turn": self.turn,
            "max_turns": self.config.max_turns,
            "last_score": None if ep.last_score is None else round(ep.last_score, 6),
            "last_error": ep.last_error,
            "success_threshold": self.config.success_threshold,
        }

    def describe(self, state: dict[str, Any], representation: Representation) -> str:
        representation = Representation(representation)
        if representation is Representation.STRUCTURED:
            return json.dumps(state, sort_keys=True)
        icon = state.get("icon_id")
        description = state.get("description")
        score = state.get("last_score")
        turn, max_turns = state.get("turn", 0), state.get("max_turns")
        if representation is Representation.SYMBOLIC:
            score_text = "none" if score is None else f"{score:.3f}"
            return f"icon={icon} description={description or '-'} turn={turn}/{max_turns} score={score_text}"
        what = f"icon {icon} ({description})" if description else f"icon {icon}"
        if score is not None:
            attempt = f"the last rendering scored {score:.3f}"
        elif state.get("last_error"):
            attempt = f"the last SVG could not be rendered ({state['last_error']})"
        else:
            attempt = "no SVG has been submitted yet"
        return f"The target is {what}. Turn {turn} of {max_turns}; {attempt}."

    def system_prompt(self, format: ResponseFormat) -> str:
        size = self.config.image_size
        return (
            "You are an SVG artist. You are shown a target image and must write SVG code that "
            "reproduces it as closely as you can.\n"
            f"The image is {size}x{size} pixels on a white background; your SVG is rendered at "
            f"the same size (its viewBox is scaled to fit), so choose any viewBox you like.\n"
            f"{self._feedback_rule()}"
            'Your answer is exactly one complete SVG document, <svg xmlns="http://www.w3.org/2000/svg" '
            'viewBox="...">...</svg>, using shapes, paths, gradients and groups. External files, '
            "links, embedded images, DTDs and entities are refused, and so are documents over "
            f"{self.config.max_svg_bytes} bytes or nested more than {self.config.max_depth} levels deep.\n"
            "Each turn's reward is the similarity of your rendering to the target, from 0 (no "
            f"better than an empty canvas) to 1 (identical); a score of {self.config.success_threshold:g} "
            f"or more succeeds and ends the episode. You have {self.config.max_turns} turn(s).\n"
            f"Example answer:\n{grading.EXAMPLE_SVG}"
        )

    def _feedback_rule(self) -> str:
        cfg = self.config
        if not cfg.unary:
            return (
                "From the second turn on you also see the rendering of your previous SVG next "
                "to the target, and may revise it.\n"
            )
        return (
            f"You have {cfg.max_attempts} attempt(s). After an answer that does not succeed you "
            f'are only told "{cfg.feedback_phrase}" (no rendering, no score); the reward of '
            f"attempt k is multiplied by {cfg.reward_decay:g}^(k-1), and repeating an earlier "
            f"SVG costs {cfg.repeat_penalty:g}.\n"
        )

    def grade_description(
        self, text: str, truth: dict[str, Any], representation: Representation
    ) -> float:
        """World-model grading for this env (used by reasoning/ instead of object grading):
        the share of the icon description's words the text names (see `grading.py`)."""
        return grading.grade_description(text, truth)

    def state_prompt(self, representation: Representation) -> StatePrompt:
        """Describe the picture (what `grade_description` rewards), with a made-up example."""
        return grading.state_prompt(representation)

    def _snapshot(self) -> Any:
        return copy.deepcopy(self._ep)

    def _restore(self, snapshot: Any) -> None:
        self._ep = copy.deepcopy(snapshot)

    # ---- helpers --------------------------------------------------------
    def _episode(self) -> Episode:
        if self._ep is None:
            raise no_episode()
        return self._ep

    def _check_action(self, action: Action) -> str | None:
        if self.action_space.lookup(action.name) is None:
            return f"unknown action {action.name!r}; answer with one SVG document"
        if not isinstance(action.payload, str) or not action.payload.strip():
            return "the answer holds no SVG document"
        return None

    def _picture(self, svg: str) -> np.ndarray:
        return render.picture(svg, self.limits, self.config.image_size)

    def _observation(self, done: bool) -> Observation:
        ep = self._episode()
        text = f"Target image:\n{IMAGE_PLACEHOLDER}\n"
        images = [ep.target]
        if self.turn == 0:
            text += "Write one SVG document that reproduces the target image."
        else:
            if ep.last_score is not None:
                text += f"Your last SVG rendered as:\n{IMAGE_PLACEHOLDER}\n"
                text += f"Similarity to the target: {ep.last_score:.3f}"
                text += f" (success at {self.config.success_threshold:g}).\n"
                images.append(ep.last_image)  # type: ignore[arg-type]
            else:
                text += f"Your last SVG could not be rendered ({ep.last_error}); shown as an empty canvas:\n"
                text += f"{IMAGE_PLACEHOLDER}\n"
                images.append(render.empty_canvas(ep.target))
            if not done:
                text += f"Turn {self.turn + 1} of {self.config.max_turns}: revise your SVG."
        return Observation(
            text=text, images=images, ground_truth=self.ground_truth(), info={"icon_id": ep.icon.id}
        )
