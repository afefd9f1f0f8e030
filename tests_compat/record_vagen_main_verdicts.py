"""Record VAGEN main's own parsers' verdicts on a corpus of answers (run by hand, any venv
with numpy and Pillow; needs a VAGEN git directory, e.g. a clone of
github.com/mll-lab-nu/VAGEN):

    python tests_compat/record_vagen_main_verdicts.py /path/to/VAGEN/.git [commit]

It loads VAGEN main's parse functions from that commit (vagen/envs/{sokoban,frozenlake}/
utils/utils.py and vagen/envs/{navigation,primitive_skill}/utils/parse.py), runs them on
the corpus below and writes tests_compat/vagen_main_verdicts.json. The compat test
test_vagen_main.py::test_verdicts_equal_vagen_mains then checks ours against it (the
compat venv has no VAGEN: PyPI's `vagen` is an unrelated package).

A verdict: VAGEN's `format_correct`, its `actions`, and `valid`: the answer is
well-formed and every action is one the environment executes (VAGEN main's
`action_is_valid` metric for sokoban, frozenlake and primitive_skill; navigation's counts
a turn valid when its first action is, see docs/wire.md).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from vagen_main_answers import FORMATS

HERE = Path(__file__).resolve().parent
COMMIT = "2936322a6f6c02fbd29ca28e4b6ec37eefefc081"
PARSERS = {
    "sokoban": "vagen/envs/sokoban/utils/utils.py",
    "frozenlake": "vagen/envs/frozenlake/utils/utils.py",
    "navigation": "vagen/envs/navigation/utils/parse.py",
    "primitive_skill": "vagen/envs/primitive_skill/utils/parse.py",
}
# what each of VAGEN main's environments executes (its ACTION_LOOKUP / _parse_action)
NAMES = {
    "sokoban": {"up", "down", "left", "right"},
    "frozenlake": {"left", "down", "right", "up"},
    "navigation": {"move_forward", "move_backward", "move_right", "move_left", "turn_right",
                   "turn_left", "look_up", "look_down"},
}  # fmt: skip
ARITY = {"pick": 3, "place": 3, "push": 6}


def load(git_dir: str, commit: str, env: str, into: Path):
    source = subprocess.run(
        ["git", "--git-dir", git_dir, "show", f"{commit}:{PARSERS[env]}"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    path = into / f"vagen_{env}_parse.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def executes(env: str, action: str) -> list | None:
    """The action as [name, args] if VAGEN main's `env` executes it, else None."""
    if env != "primitive_skill":
        return [action, []] if action in NAMES[env] else None
    try:  # VAGEN main's reading of a call: name before "(", numbers up to the next ")"
        name = action.split("(")[0].strip().lower()
        args = [float(p.strip()) for p in action.split("(")[1].split(")")[0].split(",")]
    except (IndexError, ValueError):
        return None
    return [name, args] if ARITY.get(name) == len(args) else None


def corpus(env: str, fmt: str) -> list[str]:
    """Answers well-formed and not, in and around `fmt`'s layout."""
    tag = "action" if env == "navigation" else "answer"
    good = {
        "sokoban": ["Left", "up, Right", "Down,down,LEFT,up", " right , ", "Up, Jump", "", ","],
        "frozenlake": ["Left", "down,Right", "Up, Up, Up, Up, Up, Up", "Leftt", ""],
        "navigation": ["move_forward", "turn_left|move_forward", "MOVE_LEFT | look_up",
                       "move_forward|move_forward|move_forward|move_forward|move_forward|turn_left",
                       "moveahead", "move_forward, turn_left", "fly", ""],
        "primitive_skill": ["pick(10, 20, 30)", "pick(1,2,3)|place(4, 5, 6)",
                            "push(0, 0, 0, 10, 10, 10)", "Pick(1, 2, 3)",
                            "pick(1, 2)", "pick(1, 2, 3), place(4, 5, 6)",
                            "pick(1, 2, 3)|place(4, 5, 6)|push(1, 2, 3, 4, 5, 6)",
                            "grab(1, 2, 3)", "pick(a, b, c)", "pick", ""],
    }[env]  # fmt: skip
    sep = "|" if env in ("navigation", "primitive_skill") else ","
    sections = {
        "observation": "<observation>The box is left of me.</observation>",
        "think": "<think>I should go left.</think>",
        "prediction": "<prediction>The box will be on the target.</prediction>",
    }
    obs, think, pred = sections["observation"], sections["think"], sections["prediction"]

    def wrap(answer: str) -> dict[str, str]:
        act = f"<{tag}>{answer}</{tag}>"
        return {
            "wm": f"{obs}\n{think}\n{act}\n{pred}",
            "free_think": f"{think} {act}",
            "free_wm": f"{obs} so I move {act} and then {pred}",
            "no_think": f"  {act}\n",
            "eval_mode": f"Looking around... {act} done",
        }

    texts = [wrap(a)[fmt] for a in good]
    first = good[0]
    act = f"<{tag}>{first}</{tag}>"
    other = "answer" if tag == "action" else "action"
    texts += [
        "Sure. " + wrap(first)[fmt] + " Hope this helps.",  # text around
        wrap(first)[fmt].replace(f"<{tag}>", f"<{other}>").replace(f"</{tag}>", f"</{other}>"),
        wrap(first)[fmt].upper(),  # tags in capitals
        wrap(first)[fmt] + "\n" + wrap(good[1])[fmt],  # twice: the first counts
        f"{act}",  # the answer alone
        f"{think}{act}",
        f"{obs}{think}{act}{pred}",
        f"{obs} x {think}{act}{pred}",  # text where only whitespace may be
        f"{obs}{think}{act} x {pred}",
        f"{think}{obs}{act}{pred}",  # out of order
        f"{obs}{act}{pred}",
        f"{obs}\n{act}\n{pred}",
        f"<think><observation>o</observation><reasoning>r</reasoning>"
        f"<prediction>p</prediction></think>{act}",  # the paper's layout
        f"{think}\n{act.replace(f'</{tag}>', '')}",  # unclosed
        f"{obs}{think}<{tag}>{sep.join([first] * 2)}</{tag}>{pred}",
        "no tags at all",
    ]
    return list(dict.fromkeys(texts))


def main(git_dir: str, commit: str) -> None:
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for env, formats in FORMATS.items():
            module = load(git_dir, commit, env, Path(tmp))
            sep = "|" if env in ("navigation", "primitive_skill") else ","
            limit = {"sokoban": 3, "frozenlake": 5, "navigation": 5, "primitive_skill": 2}[env]
            for fmt in formats:
                for text in corpus(env, fmt):
                    got = module.parse_response(
                        text, prompt_format=fmt, action_sep=sep, max_actions=limit
                    )
                    actions = list(got["actions"])
                    executed = [executes(env, a) for a in actions]
                    valid = bool(got["format_correct"] and actions and None not in executed)
                    cases.append({
                        "env": env, "format": fmt, "action_sep": sep, "max_actions": limit,
                        "text": text,
                        "vagen": {"format_correct": bool(got["format_correct"]),
                                  "actions": actions, "valid": valid,
                                  "executed": executed if valid else []},
                    })  # fmt: skip
    out = {
        "source": {"repo": "github.com/mll-lab-nu/VAGEN", "commit": commit,
                   "files": list(PARSERS.values())},
        "cases": cases,
    }  # fmt: skip
    (HERE / "vagen_main_verdicts.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(cases)} cases, {sum(c['vagen']['valid'] for c in cases)} valid")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else COMMIT)
