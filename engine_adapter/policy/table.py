"""The intercept policies: one table, one entry per policy (its spec and its decision function).

Adding a policy is adding an entry here: the engine's config, the command line, the benchmark and
the README's table read the names, summaries and flags from this table.

| policy            | KV at the pause  | afterwards                                 | resume queued by   | prefix cache | iterations |
|-------------------|------------------|--------------------------------------------|--------------------|--------------|------------|
| discard           | freed            |                                            | new arrival (back) | off          | budget     |
| vllm-apc          | freed            |                                            | new arrival (back) | on           | budget     |
| vllm-offload      | freed            | its blocks stay in the host tier (LRU)     | new arrival (back) | on           | budget     |
| infercept-offload | freed            | host tier; ended sessions evicted first    | new arrival (back) | on           | budget     |
| preserve          | kept             |                                            | original arrival   | off          | budget     |
| ttl               | kept             | freed after ttl_s[type]                    | original arrival   | off          | budget     |
| continuum         | kept             | freed after a TTL learned per tool         | original arrival   | on           | budget     |
| improved-discard  | freed            |                                            | original arrival   | off          | budget     |
| chunked-discard   | freed            |                                            | original arrival   | off          | <= S       |
| swap              | copied to host   | device copy freed once the copy is done    | original arrival   | off          | <= S       |
| swap-heuristic    | kept             | swapped when the call outlasts a copy      | original arrival   | off          | <= S       |
| infercept-paper   | kept             | per iteration: swap / discard / keep       | original arrival   | off          | <= S       |
| infercept         | kept             | per iteration: swap / discard / keep       | original arrival   | off          | <= S       |
| infercept-admit   | kept             | per iteration: swap / discard / keep       | new arrival (back) | off          | <= S       |
| infercept-prefetch| kept             | infercept; swapped KV fetched back early   | original arrival   | off          | <= S       |
| infercept-slack   | kept             | infercept-admit, decided once memory is short | new arrival (back) | off       | <= S       |
| infercept-apc     | kept             | infercept-admit; a resume reuses cached blocks | new arrival (back) | on        | <= S       |

"budget" is the engine's per-iteration token budget (`max_num_batched_tokens`, the same for every policy
in a benchmark); "<= S" caps iterations at the profile's saturation point S within that budget, so that
recomputation proceeds in S-sized chunks (a no-op when the budget already is S).

With prefix caching on, a swapped or discarded context's blocks keep their hashes once freed: its
resume (and a preempted request's recompute) takes the blocks the device still holds and loads or
recomputes only the rest (`InterceptCore.load_allocated` skips the hits).

`vllm-offload` is vLLM's own host KV tier (its `OffloadingConnector`, generated tokens stored too): every
full block computed is also copied to a host buffer of `swap_space_gib`, found again by its prefix-cache
hash; a resume loads from there what the device's prefix cache lost (`engine_adapter/offload_connector.py`).

Whatever the policy, preserved KV is given back under memory pressure (`decide.demotion_order`);
`infercept` copies it to the host instead where the host buffer has room (`swap_under_pressure`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from engine_adapter.policy.decide import (
    DecisionInput,
    StepDecision,
    min_waste,
    min_waste_deferred,
    min_waste_slack,
    swap_long_calls,
)


class Action(str, Enum):
    """A policy's choice for a paused request's KV at the moment it pauses."""

    PRESERVE = "preserve"
    DISCARD = "discard"
    SWAP = "swap"


StepDecider = Callable[[DecisionInput], StepDecision]
SESSION_END_LRU = "SessionEndLRU"  # the host tier's session-aware eviction (`host_tier.SessionEndLRU`)
HOST_TIER_EVICTIONS = ("lru", SESSION_END_LRU)


@dataclass(frozen=True)
class PolicySpec:
    name: str
    summary: str  # one line: CLI help and the README's policy table
    at_pause: Action
    keep_arrival_time: bool = True  # the resume keeps its place in the FCFS queue
    prefix_caching: bool = False  # freed blocks stay hittable (vLLM's prefix cache: today's vLLM, and infercept-apc)
    ttl: bool = False  # preserved KV is freed once its time-to-live has passed
    # The time-to-live is chosen at each pause from the tool's observed durations (`continuum_ttl_s`)
    # instead of read from the engine's per-type table (`engine.ttl_s`).
    ttl_online: bool = False
    swap: bool = False  # needs the host buffer and the swap connector
    # vLLM's host KV tier (OffloadingConnector over our data mover): every computed full block is stored to
    # the host by its prefix-cache hash, and loaded back on a later prefix hit. It is the engine's KV connector,
    # so not with swap; it finds blocks by hash, so only with prefix caching.
    host_tier: bool = False
    # The host tier's eviction (`HOST_TIER_EVICTIONS`): vLLM's `lru`, or `SessionEndLRU`, which evicts an
    # ended session's blocks first where vLLM's LRU makes them the most recently used (`host_tier.py`).
    host_tier_eviction: str = "lru"
    decide: StepDecider | None = None  # per-iteration decisions over preserved paused requests
    # Cap every iteration at the profile's saturation point S, so that recomputation (and prefill)
    # proceeds in S-sized chunks (paper Sec. 4.3).
    chunk_at_saturation: bool = False
    estimator: str | None = None  # call-duration estimator it forces (None: the engine's setting)
    # Under memory pressure, copy preserved KV to the host to make room for the head of the queue
    # (which waits the few steps the copy takes) instead of freeing it (`InterceptCore.demote`).
    swap_under_pressure: bool = False
    # New requests go ahead of a resumed head of the waiting queue that cannot be admitted (its whole
    # context does not fit the free blocks), for a bounded number of steps (`InterceptCore.waiting_order`).
    new_first: bool = False
    # Swapped contexts are copied back ahead of their call's predicted return, with link capacity and device
    # blocks nobody uses (`decide.prefetch_plan`, `InterceptCore._plan_prefetch`).
    prefetch: bool = False
    # Size the per-iteration swap budget N_i to the forward pass of the step being built (its running
    # requests' tokens) rather than the previous one's (the paper's): after a long prefill step, a short
    # decode step hides fewer copies, and what outlasts it stalls every running request.
    swap_budget_from_step: bool = False

    def __post_init__(self) -> None:
        if self.prefetch and not self.swap:
            raise ValueError(f"policy {self.name}: prefetching needs swap=True")
        if self.at_pause is Action.SWAP and not self.swap:
            raise ValueError(f"policy {self.name}: swapping at the pause needs swap=True")
        if self.swap_under_pressure and not self.swap:
            raise ValueError(f"policy {self.name}: swapping under pressure needs swap=True")
        if self.ttl_online and not self.ttl:
            raise ValueError(f"policy {self.name}: an online time-to-live needs ttl=True")
        if self.host_tier_eviction not in HOST_TIER_EVICTIONS:
            raise ValueError(f"policy {self.name}: unknown host tier eviction {self.host_tier_eviction!r}")
        if self.host_tier_eviction != "lru" and not self.host_tier:
            raise ValueError(f"policy {self.name}: a host tier eviction policy needs host_tier=True")
        if self.host_tier and (self.swap or not self.prefix_caching):
            raise ValueError(f"policy {self.name}: the host tier needs prefix caching and excludes swap (one KV connector)")


DEFAULT_TTL_S: Mapping[str, float] = {
    # Continuum-style: keep the KV across calls expected to be short, drop it for long ones.
    "math": 1.0,
    "qa": 2.0,
    "ve": 1.0,
    "chat": 0.0,
    "image": 0.0,
    "tts": 0.0,
    "default": 1.0,
}

POLICIES: dict[str, PolicySpec] = {p.name: p for p in (
    # Baselines.
    PolicySpec("discard", "free the KV at every pause; the resume recomputes it at the back of the queue (vLLM as the paper measured)",
               Action.DISCARD, keep_arrival_time=False),
    PolicySpec("vllm-apc", "free the KV at every pause; freed blocks stay hittable in the prefix cache (today's vLLM)",
               Action.DISCARD, keep_arrival_time=False, prefix_caching=True),
    PolicySpec("vllm-offload", "vllm-apc with vLLM's host KV tier: every computed block is also stored to host memory (swap_space_gib, LRU) and loaded back on a prefix hit the device cache lost",
               Action.DISCARD, keep_arrival_time=False, prefix_caching=True, host_tier=True),
    # Issue 33: at the paper's scale vLLM's LRU keeps ended sessions' contexts over paused ones' and the tier
    # thrashes (results/sim/paper_offload/); the same tier evicting ended sessions first holds 1.36x the rate.
    PolicySpec("infercept-offload", "vllm-offload with a host tier that knows agent sessions: an ended session's blocks are evicted first, where vLLM's LRU makes them the most recently used",
               Action.DISCARD, keep_arrival_time=False, prefix_caching=True, host_tier=True, host_tier_eviction=SESSION_END_LRU),
    PolicySpec("preserve", "keep the KV in the cache during every call", Action.PRESERVE),
    PolicySpec("ttl", "keep the KV for a fixed per-type time-to-live (engine.ttl_s), then free it",
               Action.PRESERVE, ttl=True),
    PolicySpec("continuum", "Continuum (arXiv 2511.02230): keep the KV for a per-tool time-to-live chosen at each pause from the tool's observed durations against the cost of recomputing; program-level FCFS; prefix caching on",
               Action.PRESERVE, prefix_caching=True, ttl=True, ttl_online=True),
    # The paper's ablation (Fig. 3), each step adding one technique to the one before.
    PolicySpec("improved-discard", "free the KV at every pause; the resume recomputes it in its original queue place",
               Action.DISCARD),
    PolicySpec("chunked-discard", "improved-discard, recomputing in chunks of the saturation point S (iterations capped at S)",
               Action.DISCARD, chunk_at_saturation=True),
    PolicySpec("swap", "copy the KV to host memory at every pause within each iteration's swap budget (full host: discard); recompute in S chunks",
               Action.SWAP, swap=True, chunk_at_saturation=True),
    PolicySpec("swap-heuristic", "swap, but keep the KV of calls expected back before a copy out and in could finish (paper's elapsed-time estimate)",
               Action.PRESERVE, swap=True, decide=swap_long_calls, chunk_at_saturation=True, estimator="dynamic"),
    PolicySpec("infercept-paper", "per iteration, the paper's min-waste choice (Eq. 2, 4, 5) with its elapsed-time estimate of the call's remaining time",
               Action.PRESERVE, swap=True, decide=min_waste, chunk_at_saturation=True, estimator="dynamic"),
    PolicySpec("infercept", "per iteration, the paper's min-waste choice with our estimate of the remaining time (the type's duration distribution, learned online); a call that only missed this iteration's swap budget waits for a later one rather than being recomputed; a call worth a swap is held one copy round trip before it may be swapped or discarded (calls shorter than that are not copied unless memory runs short); under memory pressure, preserved KV is swapped out rather than freed; each iteration's swap budget is sized to the forward pass of the step being built, not the previous one",
               Action.PRESERVE, swap=True, decide=min_waste_deferred, chunk_at_saturation=True, swap_under_pressure=True,
               swap_budget_from_step=True),
    # Issue 33, first step: scheduling for agents. The per-iteration choice is infercept's; what changes is
    # who waits. A resumed request whose KV went is queued at its return (vLLM's place for it), and new
    # requests pass a resumed head that cannot be admitted, so that they do not starve behind it.
    PolicySpec("infercept-admit", "infercept, with a resumed request whose KV went queued at its return, and new requests admitted ahead of a resumed head that does not fit (for a bounded number of steps), so that new requests do not starve",
               Action.PRESERVE, keep_arrival_time=False, swap=True, decide=min_waste_deferred, chunk_at_saturation=True,
               swap_under_pressure=True, new_first=True, swap_budget_from_step=True),
    # Issue 33: fetch swapped contexts back before the call returns (KVFlow, Tokencake).
    PolicySpec("infercept-prefetch", "infercept, and a swapped context is copied back ahead of its call's return (when the call is likely over by the time the copy is) with link capacity and device memory nobody uses; the host copy is kept until the resume, so giving the blocks back under pressure costs nothing",
               Action.PRESERVE, swap=True, decide=min_waste_deferred, chunk_at_saturation=True, swap_under_pressure=True,
               prefetch=True, swap_budget_from_step=True),
    # Issue 33: Eq. 2 charges preserved KV its memory-time even when no one wants the memory; below the
    # knee that swaps and recomputes contexts that `preserve` simply keeps (4 req/s on the CPU bench).
    PolicySpec("infercept-slack", "infercept-admit, but a paused context stays in place, undecided, while the device has blocks to spare (nothing waits for blocks, and the free ones cover what the running batch grows while the kept contexts could still be copied out); once memory is short it is decided as infercept decides",
               Action.PRESERVE, keep_arrival_time=False, swap=True, decide=min_waste_slack, chunk_at_saturation=True,
               swap_under_pressure=True, new_first=True, swap_budget_from_step=True),
    # Issue 33: vLLM's prefix cache under the swap policies. A context swapped out or discarded frees
    # blocks that keep their hashes until reused; the resume (and vLLM's preemption, which recomputes)
    # takes those still there and copies or recomputes only the rest, as `vllm-apc` and `vllm-offload` do.
    PolicySpec("infercept-apc", "infercept-admit with vLLM's prefix cache on: a swapped or discarded context's freed blocks stay cached until reused, and its resume (or a preempted request's recompute) loads or recomputes only the blocks the device lost",
               Action.PRESERVE, keep_arrival_time=False, swap=True, decide=min_waste_deferred, chunk_at_saturation=True,
               swap_under_pressure=True, new_first=True, swap_budget_from_step=True, prefix_caching=True),
)}
POLICY_NAMES: tuple[str, ...] = tuple(POLICIES)


def policy_spec(name: str) -> PolicySpec:
    spec = POLICIES.get(name)
    if spec is None:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
    return spec


def pause_action(spec: PolicySpec, ttl_s: float | None) -> Action:
    """The action at the pause: the spec's, except that a zero time-to-live frees at once."""
    if spec.ttl and ttl_s is not None and ttl_s <= 0:
        return Action.DISCARD
    return spec.at_pause
