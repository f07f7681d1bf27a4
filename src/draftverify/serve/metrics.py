"""Prometheus metrics of one server (its own registry: several apps in one process never collide)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..draft_length import MAX_GAMMA

TOKENS_PER_CALL_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, MAX_GAMMA + 1)  # the longest draft + 1
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "draftverify_requests",
            "HTTP requests answered, by endpoint and status code",
            ["endpoint", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "draftverify_request_seconds",
            "Seconds from a generation request's arrival to its last byte",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "draftverify_time_to_first_token_seconds",
            "Seconds from arrival to the first generated text",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "draftverify_queue_wait_seconds",
            "Seconds a request waited before its batch started",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("draftverify_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generated_tokens = Counter(
            "draftverify_generated_tokens",
            "Tokens of the answers, as usage's completion_tokens counts them (up to the token that ended each, "
            "whatever the speculation drafted past it; cancelled requests' too)",
            registry=r,
        )
        self.target_calls = Counter(
            "draftverify_target_calls",
            "Target model forwards after prefill (one per loop step, shared by every row of a batch)",
            registry=r,
        )
        self.drafted_tokens = Counter("draftverify_drafted_tokens", "Draft tokens proposed", registry=r)
        self.accepted_tokens = Counter(
            "draftverify_accepted_tokens",
            "Draft tokens the verifier kept (and that were emitted, within an answer)",
            registry=r,
        )
        self.accepted_at = Counter(
            "draftverify_accepted_by_position",
            "Accepted draft tokens by their position in the draft (1: the first drafted token); the sum over "
            "positions is draftverify_accepted_tokens",
            ["position"],
            registry=r,
        )
        self.tokens_per_call = Histogram(
            "draftverify_tokens_per_target_call",
            "Tokens a request gained from one target forward (accepted drafts + the target's own); its count adds up "
            "the usage's target_calls, its sum the completion tokens",
            buckets=TOKENS_PER_CALL_BUCKETS,
            registry=r,
        )
        self.finished = Counter(
            "draftverify_finished_requests",
            "Generations that ended, by reason (stop, length, cancelled, error)",
            ["reason"],
            registry=r,
        )
        self.rejected = Counter(
            "draftverify_rejected_requests",
            "Requests turned away before generating (queue full, shutting down)",
            ["reason"],
            registry=r,
        )
        self.queue_depth = Gauge("draftverify_queue_depth", "Requests waiting for the generation worker", registry=r)
        self.running = Gauge("draftverify_running_rows", "Rows being generated right now", registry=r)
        self.joined = Counter(
            "draftverify_joined_rows", "Requests that joined a batch already running (continuous batching)", registry=r
        )
        self.batch_size = Histogram(
            "draftverify_batch_size",
            "Rows that started a batch, or joined one together",
            registry=r,
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64),
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
