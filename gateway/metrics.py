"""Prometheus metrics of the gateway and the engine (`GET /metrics`).

Counters and histograms move as events happen in the gateway; the engine's state (KV blocks by state,
waste, swap bytes, recomputed tokens) is read from the engine core at each scrape, so the scrape shows
the engine's own accounting, not a copy that could drift.
"""

from __future__ import annotations

from collections import Counter as TallyCounter
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from engine_adapter.intercept.reports import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.intercepts = Counter("infercept_intercepts", "Tool-call intercepts by augmentation type and the policy's choice",
                                  ["type", "policy"], registry=r)
        self.tool_latency = Histogram("infercept_tool_latency_seconds", "Augmentation call duration", ["tool", "type", "outcome"],
                                      buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300), registry=r)
        self.messages = Counter("infercept_messages", "Messages handled, by route and outcome", ["route", "outcome"], registry=r)
        self.invented_observations = Counter("infercept_invented_observations", "Observations the model began writing itself "
                                             "(generation stopped there; only tools write observations)", registry=r)
        self.disconnects = Counter("infercept_client_disconnects", "Streams abandoned by their client (generation aborted)", registry=r)
        self.sessions_expired = Counter("infercept_sessions_expired", "Sessions closed for idleness", registry=r)
        self.sessions_hibernated = Counter("infercept_sessions_hibernated", "Idle sessions that left memory (kept in "
                                           "the store)", registry=r)
        self.sessions_rehydrated = Counter("infercept_sessions_rehydrated", "Sessions read back from the store at "
                                           "their next request after leaving memory", registry=r)
        self.sessions_taken_over = Counter("infercept_sessions_taken_over", "Sessions this replica took over from a "
                                           "replica whose lease lapsed", registry=r)
        self.sessions_fenced = Counter("infercept_sessions_fenced", "Sessions this replica stopped serving because "
                                       "another replica took them over (a write was fenced)", registry=r)
        self.requests_forwarded = Counter("infercept_requests_forwarded", "Requests forwarded to the replica that owns "
                                          "their session", registry=r)
        self.sessions = Gauge("infercept_sessions", "Open sessions by state", ["state"], registry=r)
        self.kv_blocks = Gauge("infercept_kv_blocks", "KV blocks by state", ["state"], registry=r)
        self.rank_kv_blocks = Gauge("infercept_rank_kv_blocks", "KV blocks by data-parallel rank and state", ["rank", "state"], registry=r)
        self.rank_sessions = Gauge("infercept_rank_sessions", "Open sessions pinned to each data-parallel rank", ["rank"], registry=r)
        self.waste_token_s = Gauge("infercept_memory_waste_token_seconds", "KV memory waste (token-seconds) by kind", ["kind"], registry=r)
        self.waste_gb_min = Gauge("infercept_memory_waste_gb_minutes", "KV memory waste (GB-minutes) by kind", ["kind"], registry=r)
        self.swap_bytes = Gauge("infercept_swap_bytes", "Bytes of KV copied between device and host, by direction", ["direction"], registry=r)
        self.recomputed = Gauge("infercept_recomputed_tokens", "Context tokens recomputed after intercepts", registry=r)
        self.prefix_hits = Gauge("infercept_prefix_hit_tokens", "Context tokens restored from the prefix cache after intercepts", registry=r)
        self.paused = Gauge("infercept_paused_requests", "Requests paused in a call", registry=r)
        self.engine_intercepts = Gauge("infercept_engine_intercepts", "Pauses seen by the engine (tool calls and turn ends)", registry=r)
        self.recompute_share = Gauge("infercept_recompute_share_of_forward", "Share of forward time spent recomputing", registry=r)
        self.engine_restarts = Counter("infercept_engine_restarts", "Engines restarted after their core process died", registry=r)
        self.store_commit = Histogram("infercept_store_commit_seconds", "Time from a session's commit to the store's "
                                      "acknowledgement (paid before each batch of events is sent)",
                                      buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1),
                                      registry=r)
        self.store_transactions = Gauge("infercept_store_transactions", "Transactions the session store committed "
                                        "(several sessions' commits share one)", registry=r)
        self.turns_in_progress = Gauge("infercept_turns_in_progress", "Turns generating or in a server tool "
                                       "(bounded by server.max_queued_turns)", registry=r)

    def intercept(self, aug_type: str, policy: str) -> None:
        self.intercepts.labels(aug_type, policy).inc()

    def tool_done(self, tool: str, aug_type: str, seconds: float, outcome: str) -> None:
        self.tool_latency.labels(tool, aug_type, outcome).observe(seconds)

    def refresh(self, stats: EngineStats, session_states: Iterable[str]) -> None:
        b = stats.blocks
        for state, n in (("free", b.free), ("running", b.running), ("preserved", b.preserved), ("swapped", b.swapped_to_host)):
            self.kv_blocks.labels(state).set(n)
        for kind, v in stats.waste.by_kind.items():
            self.waste_token_s.labels(kind).set(v.token_s)
            self.waste_gb_min.labels(kind).set(v.gb_min)
        self.recompute_share.set(stats.waste.recompute_share_of_forward)
        self.recomputed.set(stats.totals.recomputed_tokens)
        self.prefix_hits.set(stats.totals.prefix_hit_tokens)
        self.engine_intercepts.set(stats.totals.intercepts)
        self.paused.set(stats.paused)
        swap = stats.swap
        # Whole blocks move (a context's partly filled last block too): bytes from blocks, not tokens.
        block_bytes = stats.block_size * swap.kv_bytes_per_token if swap else 0
        self.swap_bytes.labels("out").set(swap.blocks_out * block_bytes if swap else 0)
        self.swap_bytes.labels("in").set(swap.blocks_in * block_bytes if swap else 0)
        tally = TallyCounter(session_states)
        for state in ("generating", "in_tool", "awaiting_user"):
            self.sessions.labels(state).set(tally.get(state, 0))

    def refresh_ranks(self, ranks: Sequence[EngineStats], sessions: Sequence[int]) -> None:
        for r, st in enumerate(ranks):
            b = st.blocks
            for state, n in (("free", b.free), ("running", b.running), ("preserved", b.preserved), ("swapped", b.swapped_to_host)):
                self.rank_kv_blocks.labels(str(r), state).set(n)
            self.rank_sessions.labels(str(r)).set(sessions[r] if r < len(sessions) else 0)

    def refresh_gateway(self, turns_in_progress: int, store: Any) -> None:
        self.turns_in_progress.set(turns_in_progress)
        self.store_transactions.set(store.commits)

    def render(self, with_vllm: bool = False) -> bytes:
        """Ours, plus vLLM's own families (`vllm:*`, in prometheus_client's default registry) when the
        engine exports them, so dashboards built for vLLM work unchanged."""
        out = generate_latest(self.registry)
        if with_vllm:
            from prometheus_client import REGISTRY

            out += generate_latest(REGISTRY)
        return out
