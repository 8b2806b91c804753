"""What `plan serve` counts, exposed at /metrics in Prometheus's text format. The engine thread
updates them (prometheus_client's metrics are thread-safe); a registry of their own per server."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.running = Gauge("llmplan_requests_running", "Requests in the engine's running batch", registry=r)
        self.waiting = Gauge("llmplan_requests_waiting", "Requests waiting for a batch slot or K/V blocks", registry=r)
        self.kv_used = Gauge("llmplan_kv_blocks_used", "K/V cache blocks held by requests", registry=r)
        self.kv_free = Gauge("llmplan_kv_blocks_free", "K/V cache blocks free (some still caching a prefix)",
                             registry=r)
        self.prompt_tokens = Counter("llmplan_prompt_tokens", "Prompt tokens of requests that began generating",
                                     registry=r)
        self.generated_tokens = Counter("llmplan_generation_tokens", "Tokens generated", registry=r)
        self.preemptions = Counter("llmplan_preemptions", "Requests preempted for K/V blocks (recomputed later)",
                                   registry=r)
        self.finished = Counter("llmplan_requests_finished", "Requests ended, by finish reason", ["finish_reason"],
                                registry=r)
        self.rejected = Counter("llmplan_requests_rejected", "Requests answered 429 because the queue was full",
                                registry=r)
        self.ttft = Histogram("llmplan_time_to_first_token_seconds", "From a request's arrival to its first token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("llmplan_time_per_output_token_seconds", "Between a request's consecutive tokens",
                              buckets=TPOT_BUCKETS, registry=r)

    def text(self) -> bytes:
        return generate_latest(self.registry)
