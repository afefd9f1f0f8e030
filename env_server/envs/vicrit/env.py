"""ViCrit, the caption-hallucination critic: find the one wrong span in a caption.

The agent sees a scene of one of our ground-truth environments (a Sokoban room, a
FrozenLake map) and a paragraph-long caption of it in which one short span was changed
to something false: an object, an attribute (colour), a count or a spatial relation or
position. It answers with that span. The reward is 1 for an exact match after
normalisation (case, punctuation, whitespace) and 0 otherwise; the token F1 against the
span is reported in the info. See `caption.py` for how captions and errors are made
and verified, `data.py` for the sources (our scenes, or a user's JSONL file).

Single-turn by default. With `feedback: "unary"` (UFO, `envs/_feedback.py`) a wrong
answer is followed by the bare phrase "Let's try again." and another attempt, up to
`max_attempts`, the reward decaying with the attempt and a repeated answer penalised.

The ground truth is the caption, the span, its category and the true words ("original");
world-model grading (`grade_description`, `grading.py`) scores how many of the true
words an `<observation>` or `<prediction>` names. The oracle (`oracle.py`) answers with
the span; `render.py` sizes the scene image.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, replace
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
    Transition,
)
from env_server.core.env import StatePrompt, no_episode
from env_server.core.spatial import GradingSpec

from .._feedback import Attempts, FeedbackConfig, feedback_observation
from . import caption as cap
from . import data, grading, oracle, render

ACTION = "span"
Source = Literal["sokoban", "frozenlake"]
SOURCES: tuple[Source, ...] = ("sokoban", "frozenlake")

# the made-up example of the prompts
_EXAMPLE_CAPTION = (
    "A wooden table stands in a bright kitchen. Two apples lie on the table, to the left "
    "of a blue jug."
)
_EXAMPLE_SPAN = "Two apples"
_EXAMPLE_ORIGINAL = "Three apples"


class VicritConfig(FeedbackConfig):
    """Options of the ViCrit environment."""

    max_turns: int = Field(
        1,
        ge=1,
        le=100,
        description="Answers per episode: 1 without feedback; under feedback 'unary' it "
        "equals max_attempts.",
    )
    sources: list[Source] = Field(
        default_factory=lambda: list(SOURCES),
        min_length=1,
        description="Ground-truth environments whose scenes are captioned: sokoban, frozenlake.",
    )
    category_weights: dict[cap.Category, float] = Field(
        default_factory=lambda: dict.fromkeys(cap.CATEGORIES, 1.0),
        description="Relative frequency of each error category (object, attribute, count, "
        "spatial); equal weights balance them. A category left out is never drawn.",
    )
    category_balance: Literal["stratified", "random"] = Field(
        "stratified",
        description="stratified: consecutive seeds spread over the categories in proportion "
        "to the weights (any run of seeds is balanced); random: an independent draw per seed.",
    )
    image_size: int = Field(256, ge=32, le=1024, description="Side of the scene image, pixels.")
    jsonl_path: str | None = Field(
        None,
        description='Use a JSONL file of {"image", "caption", "span", "category", "original"?} '
        "objects under $VISENV_DATA_DIR instead of generated scenes.",
    )

    @field_validator("category_weights")
    @classmethod
    def _weights(cls, weights: dict[str, float]) -> dict[str, float]:
        if any(not (w >= 0 and np.isfinite(w)) for w in weights.values()):
            raise ValueError("category weights must be finite and non-negative")
        if not any(w > 0 for w in weights.values()):
            raise ValueError("at least one category needs a positive weight")
        return weights

    @field_validator("feedback")
    @classmethod
    def _single_turn_without_feedback(cls, feedback: str, info: ValidationInfo) -> str:
        turns = info.data.get("max_turns")
        if feedback == "none" and turns not in (None, 1):
            raise ValueError(
                f"without feedback vicrit is single-turn (max_turns 1, got {turns}); for more "
                "attempts set feedback 'unary' and max_attempts"
            )
        return feedback


@dataclass
class Episode:
    item: data.Item
    attempts: Attempts = field(default_factory=Attempts)
    answer: str | None = None  # the last answer, normalised
    success: bool = False
    reward: float = 0.0  # the last answer's reward
    f1: float = 0.0  # the last answer's token F1 against the span


class VicritEnv(Environment):
    name: ClassVar[str] = "vicrit"
    Config: ClassVar[type[EnvConfig]] = VicritConfig
    description: ClassVar[str] = (
        "ViCrit caption critic: point out the one wrong span in a caption of a scene "
        "(optionally with UFO's unary 'try again' feedback)."
    )
    grading: ClassVar[GradingSpec | None] = None  # graded by grade_description

    config: VicritConfig

    def __init__(self, config: VicritConfig | None = None) -> None:
        super().__init__(config)
        cfg = self.config
        self.rows = data.jsonl_rows(cfg.jsonl_path) if cfg.jsonl_path else None
        self._ep: Episode | None = None

    @classmethod
    def action_space_for(cls, config: VicritConfig) -> ActionSpace:
        return ActionSpace(
            kind=ActionKind.DOCUMENT,
            names=(ACTION,),
            max_per_turn=1,
            description="The wrong span of the caption, word for word as it is written there.",
        )

    # ---- contract -------------------------------------------------------
    def _reset(self, seed: int) -> Observation:
        self._ep = Episode(self._item(seed))
        return self._observation()

    def _apply(self, actions: list[Action]) -> Transition:
        ep = self._episode()
        cfg = self.config
        answer, invalid = self._answer(actions)
        correct = answer is not None and cap.exact_match(answer, ep.item.span)
        key = cap.normalize(answer) if answer is not None else None
        attempt = ep.attempts.record(
            cfg, key=key, correct=correct, base_reward=1.0 if correct else 0.0
        )
        ep.answer, ep.success = key, correct
        ep.reward, ep.f1 = attempt.reward, cap.token_f1(answer or "", ep.item.span)
        if cfg.unary and not correct:
            observation = feedback_observation(cfg, self.ground_truth())
        else:
            observation = self._observation()
        return Transition(
            observation=observation,
            reward=attempt.reward,
            terminated=correct,
            truncated=False,  # one answer per turn: the base class ends the last attempt
            success=correct,
            actions_executed=int(answer is not None),
            invalid_actions=invalid,
            info={
                "exact_match": correct,
                "f1": round(ep.f1, 6),
                "answer": key,
                "feedback": cfg.feedback,
                **attempt.info(),
            },
        )

    def ground_truth(self) -> dict[str, Any]:
        ep = self._episode()
        item = ep.item
        return {
            "caption": item.caption,
            "span": item.span,
            "category": item.category,
            "original": item.original,
            "source": item.source,
            "source_seed": item.source_seed,
            "row": item.row,
            "attempt": ep.attempts.count,
            "max_attempts": self.config.max_turns,
            "solved": ep.success,
        }

    def describe(self, state: dict[str, Any], representation: Representation | str) -> str:
        try:
            representation = Representation(representation)
            span, category = str(state["span"]), str(state["category"])
            original = state.get("original")
        except (KeyError, TypeError, ValueError) as exc:
            raise EnvError(f"describe(): not a vicrit ground-truth state ({exc!r})") from exc
        if representation is Representation.STRUCTURED:
            return json.dumps({"span": span, "category": category, "original": original})
        if representation is Representation.SYMBOLIC:
            return f"span={span}; category={category}; original={original or '-'}"
        truly = f"; the image shows {original!r} instead" if original else ""
        return f"The caption's {category} error is {span!r}{truly}."

    def system_prompt(self, format: ResponseFormat | str) -> str:
        cfg = self.config
        text = (
            "You are a careful image critic. You are shown an image and a long caption of "
            "it. The caption is accurate except for exactly one short span that was changed "
            "to something false about the image: an object (what a thing is), an attribute "
            "(a colour), a count (a number with its noun, like 'three holes') or a spatial "
            "relation or position (like 'above and to the left of' or 'second row').\n"
            "Find that span and answer with it alone, word for word as it is written in the "
            "caption: no quotes, no explanation, no correction. Case and punctuation do not "
            "matter, but every word must be the span's and nothing more.\n"
            f'Example: for the caption "{_EXAMPLE_CAPTION}" of a picture with three '
            f"apples, the answer is: {_EXAMPLE_SPAN}\n"
            "Reward: 1 for the exact span, 0 otherwise."
        )
        if cfg.unary:
            decay = (
                f"; a correct answer on attempt k earns {cfg.reward_decay:g}^(k-1)"
                if cfg.reward_decay < 1
                else ""
            )
            text += (
                f"\nYou have {cfg.max_attempts} attempt(s). After a wrong answer you are only "
                f'told "{cfg.feedback_phrase}"{decay}, and repeating an earlier answer costs '
                f"{cfg.repeat_penalty:g}."
            )
        return text

    def _oracle(self) -> list[Action]:
        return oracle.answer(self._episode().item, ACTION)

    def grade_description(
        self, text: str, truth: dict[str, Any], representation: Representation
    ) -> float:
        """World-model grading: the share of the true words (the span as the image has it)
        that an `<observation>` or `<prediction>` names (`grading.grade`)."""
        return grading.grade(text, truth)

    def state_prompt(self, representation: Representation) -> StatePrompt:
        rep = Representation(representation)
        state = {"span": _EXAMPLE_SPAN, "category": "count", "original": _EXAMPLE_ORIGINAL}
        forms = {
            Representation.NATURAL: "in a sentence",
            Representation.SYMBOLIC: "as 'span=...; category=...; original=...'",
            Representation.STRUCTURED: 'as one JSON object with "span", "category" and "original"',
        }
        instruction = (
            "<observation> says what the image really shows where the caption is wrong, and "
            f"<prediction> what the corrected caption would say there, {forms[rep]}. They are "
            "graded by how many of the true words they name."
        )
        return StatePrompt.written(
            self,
            rep,
            instruction=instruction,
            reminder=f"{forms[rep]}, naming what the image truly shows",
            before=state,
            after=state,
            answer=_EXAMPLE_SPAN,
        )

    def _snapshot(self) -> Any:
        # everything but the JSONL rows, which never change (and may be many)
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k != "rows"})

    def _restore(self, snapshot: Any) -> None:
        self.__dict__.update(copy.deepcopy(snapshot))

    # ---- helpers --------------------------------------------------------
    def _item(self, seed: int) -> data.Item:
        cfg = self.config
        if self.rows is None:
            item, _ = data.generate(
                seed, cfg.sources, cfg.category_weights, balance=cfg.category_balance
            )
        else:
            row = data.pick_row(self.rows, seed, cfg.category_weights, cfg.category_balance)
            item = data.Item(
                image=data.load_image(row, cfg.jsonl_path or ""),
                caption=row.caption,
                span=row.span,
                category=row.category,
                original=row.original,
                source="jsonl",
                source_seed=None,
                row=row.line,
            )
        assert item.image is not None
        return replace(item, image=render.sized(item.image, cfg.image_size))

    def _answer(self, actions: list[Action]) -> tuple[str | None, list[str]]:
        """The answer's span (at most one action: the base class cut the rest), or None
        and why it is not one."""
        if not actions:
            return None, [f"{ACTION}: the answer holds no span"]
        (action,) = actions
        if self.action_space.lookup(action.name) is None:
            return None, [f"{action.name}: unknown action; answer with the wrong span"]
        if not isinstance(action.payload, str) or not cap.normalize(action.payload):
            return None, [f"{ACTION}: the answer holds no words"]
        return action.payload, []

    @staticmethod
    def _verdict(ep: Episode) -> str:
        """The text after the last answer: the right span, what the image shows, the score."""
        item = ep.item
        truly = f"; the image shows {item.original!r}" if item.original else ""
        return (
            f"{'Correct' if ep.success else 'Not correct'}. The wrong span was {item.span!r} "
            f"(an error of {item.category}{truly}). Score: {ep.reward:g} "
            f"(token F1 {ep.f1:.2f}). The episode has ended."
        )

    def _episode(self) -> Episode:
        if self._ep is None:
            raise no_episode()
        return self._ep

    def _observation(self) -> Observation:
        ep = self._episode()
        item = ep.item
        if ep.attempts.count == 0:
            text = (
                f"Image:\n{IMAGE_PLACEHOLDER}\nCaption: {item.caption}\n"
                "One span of this caption is wrong about the image. Answer with that span."
            )
            if self.config.unary:
                text += f" You have {self.config.max_attempts} attempt(s)."
            images = [item.image]
        else:
            text = self._verdict(ep)
            images = []
        return Observation(
            text=text,
            images=images,  # type: ignore[list-item]
            ground_truth=self.ground_truth(),
            info={"source": item.source},
        )
