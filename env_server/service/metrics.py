"""Prometheus metrics of one EnvService (its own registry, so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.sessions = Gauge("visenv_sessions", "Open sessions.", registry=self.registry)
        self.steps = Counter(
            "visenv_steps", "Turns applied, per environment.", ["env"], registry=self.registry
        )
        self.resets = Counter(
            "visenv_resets", "Episodes started (create and reset).", ["env"], registry=self.registry
        )
        self.step_seconds = Histogram(
            "visenv_step_call_seconds",
            "Latency of one step call (a whole batch), in the service.",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5),
            registry=self.registry,
        )
        self.errors = Counter(
            "visenv_errors", "Error replies, per code.", ["code"], registry=self.registry
        )
        self.worker_restarts = Counter(
            "visenv_worker_restarts",
            "Worker processes replaced after dying.",
            registry=self.registry,
        )
        self.worker_timeouts = Counter(
            "visenv_worker_timeouts",
            "Worker processes killed for not answering within their deadline (stuck).",
            registry=self.registry,
        )
        self.reaped = Counter(
            "visenv_sessions_reaped",
            "Sessions closed after their idle timeout.",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
