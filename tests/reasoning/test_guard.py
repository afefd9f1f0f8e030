"""The reward-hacking guard."""

import pytest

from env_server.reasoning import GuardConfig, ResponseGuard

HACK = "<think><observation>The box is below me.</observation></think><answer>Up</answer>"


def test_frequent_low_scoring_response_is_penalised():
    guard = ResponseGuard()
    assert guard.penalty(HACK, 0.2) == 0.0  # seen once: not frequent yet
    assert guard.penalty(HACK, 0.2) == 0.1
    assert guard.penalty("  " + HACK.replace(" ", "  ") + "\n", 0.2) == 0.1  # whitespace ignored
    assert guard.count(HACK) == 3


def test_frequent_response_that_scores_well_is_not_penalised():
    guard = ResponseGuard()
    for _ in range(5):
        assert guard.penalty(HACK, 0.9) == 0.0
    assert guard.penalty(HACK, 0.7) == 0.0  # the threshold itself is fine
    assert guard.penalty(HACK, 0.69) == 0.1


def test_only_the_top_k_are_watched():
    guard = ResponseGuard(GuardConfig(top_k=2))
    for text, times in (("a", 5), ("b", 4), ("c", 3)):
        for _ in range(times):
            guard.penalty(text, 1.0)
    assert guard.penalty("c", 0.0) == 0.0  # 4 times, ties "b"; "b" was counted first
    assert guard.penalty("b", 0.0) == 0.1  # 5 times: in the top 2 with "a"
    assert guard.penalty("c", 0.0) == 0.0  # 5 times: ties "a" and "b", which came first
    assert guard.penalty("c", 0.0) == 0.1  # 6 times: the most frequent
    assert guard.penalty("d", 0.0) == 0.0


def test_the_window_bounds_memory_and_drops_the_least_frequent():
    guard = ResponseGuard(GuardConfig(window=3, top_k=1))
    for text in ("a", "a", "a", "b", "b", "c"):
        guard.penalty(text, 1.0)
    guard.penalty("d", 1.0)  # full: "c" (seen once) is dropped
    assert len(guard) == 3
    assert guard.count("c") == 0 and guard.count("a") == 3 and guard.count("d") == 1


def test_disabled_guard_records_nothing():
    guard = ResponseGuard(GuardConfig(enabled=False))
    for _ in range(10):
        assert guard.penalty(HACK, 0.0) == 0.0
    assert len(guard) == 0


def test_penalty_and_threshold_are_configurable():
    guard = ResponseGuard(GuardConfig(penalty=0.3, threshold=0.5, min_count=1))
    assert guard.penalty(HACK, 0.4) == pytest.approx(0.3)
    assert guard.penalty(HACK, 0.6) == 0.0


def test_window_drops_the_least_frequent_oldest_response_like_a_plain_counter():
    """The fast eviction (responses seen once, in first-seen order) drops exactly the
    response a full scan would: the least frequent, the oldest among equals."""
    import random
    from collections import Counter

    cfg = GuardConfig(window=8, top_k=2, min_count=2, threshold=0.7)
    guard, reference = ResponseGuard(cfg), Counter()
    rng = random.Random(0)
    for _ in range(3000):
        text = f"answer {rng.choice(range(20)) if rng.random() < 0.7 else rng.random()}"
        if text not in reference and len(reference) >= cfg.window:
            del reference[min(reference.items(), key=lambda kv: kv[1])[0]]
        reference[text] += 1
        guard.penalty(text, 0.5)
        assert len(guard) == len(reference)
        assert all(guard.count(t) == c for t, c in reference.items())


@pytest.mark.parametrize("top_k, window", [(1, 4), (2, 8), (5, 1000), (3, 6)])
def test_penalty_ranks_like_most_common_of_the_whole_window(top_k, window):
    """The count-of-counts ranking penalises exactly the responses a ranking of the whole
    window (most_common, insertion order among ties) would, ties at the boundary included."""
    import random
    from collections import Counter

    cfg = GuardConfig(window=window, top_k=top_k, min_count=2, threshold=0.7)
    guard, reference = ResponseGuard(cfg), Counter()
    rng = random.Random(top_k * 1000 + window)
    penalised = 0
    for _ in range(4000):
        text = f"answer {rng.choice(range(12)) if rng.random() < 0.8 else rng.random()}"
        if text not in reference and len(reference) >= cfg.window:
            del reference[min(reference.items(), key=lambda kv: kv[1])[0]]
        reference[text] += 1
        top = {t for t, _ in reference.most_common(top_k)}
        expected = cfg.penalty if reference[text] >= 2 and text in top else 0.0
        assert guard.penalty(text, 0.5) == expected
        penalised += expected > 0
    assert penalised > 100  # the comparison saw both answers


def test_a_key_computed_elsewhere_counts_as_its_text():
    """A worker sends the response's key (`response_key`) instead of its text: the guard
    counts and penalises it exactly as the text, whitespace-normalised."""
    from env_server.reasoning.guard import response_key

    by_text, by_key = (ResponseGuard(GuardConfig(min_count=2, top_k=1)) for _ in range(2))
    texts = [HACK, "  " + HACK + "\n", "other", HACK, "other", "other"]
    penalties = []
    for n, text in enumerate(texts):
        score = 0.1 * n
        penalties.append(by_key.penalty_of_key(response_key(text), score))
        assert penalties[-1] == by_text.penalty(text, score)
    assert penalties[1] > 0  # the second HACK, with other whitespace, is already penalised
    assert by_key.count(HACK) == by_text.count(HACK) == 3
    assert response_key(HACK) != response_key("other")
