"""The short soak (bench/soak.py, 24 s): concurrent sessions, random single and batch
clients over gRPC and REST, half of them through a lossy proxy, a worker SIGKILLed every
8 s, the cap probed, abandoned sessions reaped. The audit must come out clean."""

from __future__ import annotations

import asyncio

from bench import soak


def test_short_soak_audit_is_clean():
    args = soak.parse_args(
        ["--minutes", "0.4", "--sessions", "200", "--heavy", "0", "--kill-every", "8",
         "--idle-timeout", "12", "--abandon", "10", "--single-clients", "8",
         "--single-slots", "2", "--batch-clients", "2", "--chunk", "32", "--lossy", "0.5",
         "--lose-rate", "0.2"]
    )  # fmt: skip
    report = asyncio.run(soak.soak(args))
    summary = {k: v for k, v in report.items() if k != "rss_series_mib"}
    assert report["replies_mismatched"] == 0, summary
    assert report["steps_failed_otherwise"] == 0, summary
    assert report["steps_acknowledged"] > 100, summary
    # exactly once: every applied step acknowledged, but those whose reply was dropped and
    # whose session was then lost with its worker (the client saw SESSION_LOST)
    assert 0 <= report["steps_applied_minus_acknowledged"] <= report["steps_in_doubt_bound"]
    assert report["replies_dropped_by_proxy"] > 0, summary
    assert report["worker_kills"] >= 2 and report["worker_restarts"] >= 2, summary
    assert report["steps_session_lost"] > 0, summary  # the kills cost steps, said so
    assert report["max_sessions_seen"] <= report["cap"], summary
    assert report["capacity_answers"] > 0, summary
    assert report["abandoned_fates"].get("open", 0) == 0, summary  # reaped (or lost)
    assert report["reaped_total"] >= report["abandoned_fates"].get("NOT_FOUND", 0) > 0
    assert report["server_internal_log_lines"] == 0, summary
    assert report["ok"], summary
