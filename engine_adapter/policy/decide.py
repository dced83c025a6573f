"""Per-iteration decisions over paused requests: pure functions of numbers and ids (no vLLM, no torch),
shared by the engine's intercept core and the simulator.

* `demotion_order`: which preserved KV to give back first when running work needs the room (every
  policy: a paused request never blocks a running or resuming one).
* `ttl_expired`: which preserved KV has outlived its time-to-live (the `ttl` and `continuum` policies);
* `continuum_ttl_s`: Continuum's time-to-live for one pause, from the tool's observed durations.
* `min_waste`: the paper's per-iteration choice (Eq. 2, 4, 5): swap out the paused requests that would
  waste the most within the swap-out budget, preserve or discard the rest, whichever wastes less.
* `prefetch_plan`: which swapped contexts to copy back ahead of their call's return, and which
  fetched-back ones to give up (`infercept-prefetch`).
* `min_waste_deferred`: the same, but a request that only missed this iteration's swap budget waits
  for a later one when holding it until then wastes less than recomputing it, and a request whose swap
  would pay off is held one copy round trip before it may be swapped or discarded (`renting`)
  (`infercept`).
* `min_waste_slack`: `min_waste_deferred` over the paused requests that slack device memory does not
  keep in place (`slack_kept`) (`infercept-slack`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from engine_adapter.policy.estimator import DurationEstimator
from engine_adapter.policy.profile import Profile
from engine_adapter.policy.waste import (
    recompute_chunk_tokens,
    swapped_blocks,
    waste_chunked_discard_byte_s,
    waste_preserve_byte_s,
)


@dataclass(frozen=True)
class PausedView:
    """What a decision may know about one paused request whose KV is on the device."""

    request_id: str
    aug_type: str
    context_tokens: int
    paused_at_s: float  # engine clock (monotonic seconds)
    expected_duration_s: float | None
    ttl_s: float = math.inf  # kept at most this long (ttl policies: set at the pause)


def demotion_order(views: Sequence[PausedView]) -> list[str]:
    """Preserved requests to free first when running work needs blocks or slots: the one expected
    back last goes first (expected return = pause + expected duration; unknown durations count as
    returning never), ties broken by the larger context (frees more)."""

    def expected_back(v: PausedView) -> float:
        d = v.expected_duration_s
        return math.inf if d is None else v.paused_at_s + d

    order = sorted(views, key=lambda v: (expected_back(v), v.context_tokens), reverse=True)
    return [v.request_id for v in order]


def ttl_for(ttl_s: Mapping[str, float], aug_type: str) -> float:
    """A type's time-to-live; types not in the table use its `default` entry (else live forever)."""
    return float(ttl_s.get(aug_type, ttl_s.get("default", math.inf)))


def ttl_expired(views: Sequence[PausedView], now_s: float) -> list[tuple[str, float]]:
    """(request id, the moment its TTL ran out) for every view whose TTL ran out by `now_s`."""
    out = []
    for v in views:
        expiry = v.paused_at_s + v.ttl_s
        if now_s >= expiry:
            out.append((v.request_id, expiry))
    return out


def continuum_ttl_s(durations_s: Sequence[float], context_tokens: int, kv_bytes_per_token: int, reload_byte_s: float) -> float:
    """Continuum's time-to-live (arXiv 2511.02230), per tool and learned online: the tau that minimizes
    the expected cost of keeping the KV at most tau over the tool's observed call durations T,

        E[ M * ctx * min(T, tau) ] + P(T > tau) * reload,

    the memory held while waiting against the reload (recomputation) paid when the call outlasts tau.
    Costs in memory-time (byte-seconds), the unit of InferCept's waste equations, so that the two policies
    weigh the same quantities; `reload_byte_s` is Eq. 4's recompute waste for this context. Over an
    empirical distribution the cost is linear between samples, so the minimum is at 0 or a sample.
    The paper weighs the probability that the call is back within tau against what pinning costs; its
    released code (vllm-continuum, Jan 2026) instead keeps the KV 2 s for tools whose mean duration is
    under 2 s and none otherwise. This is the paper's trade-off with InferCept's costs plugged in.
    Also unlike that code, the reload cost ignores the re-queue delay: the resume keeps its program's
    place in the queue (program-level FCFS), which is what makes that delay small."""
    xs = sorted(x for x in durations_s if x >= 0 and math.isfinite(x))
    if not xs:
        return 0.0
    n, mem = len(xs), context_tokens * kv_bytes_per_token
    best_tau, best_cost = 0.0, reload_byte_s  # tau = 0: every call reloads
    back_before = 0.0  # sum of the durations below tau (those calls hold their KV only that long)
    for i, tau in enumerate(xs):
        later = n - bisect.bisect_right(xs, tau)  # calls that outlast tau (ties return at tau)
        cost = mem * (back_before + tau * (n - i)) / n + reload_byte_s * later / n
        if cost < best_cost:
            best_tau, best_cost = tau, cost
        back_before += tau
    return best_tau


@dataclass(frozen=True)
class PausedCost:
    """One paused request's waste under each choice for this iteration (byte-seconds)."""

    request_id: str
    context_blocks: int
    waste_preserve: float
    waste_discard: float
    # Our extension: swapping only pays when the call is expected to outlast the round trip of the
    # copy (out and back in); otherwise the request would be back before its KV is.
    swap_worthwhile: bool = True
    # For waiting on a later iteration's swap budget (`SwapQueue`); 0 bytes: never waits.
    remaining_s: float = 0.0  # the call's expected remaining time
    round_trip_s: float = 0.0  # its copy out and back in
    held_s: float = 0.0  # how long its KV has been held idle since the pause
    context_bytes: int = 0  # its KV (C x M): Eq. 2's waste per second held

    @property
    def waste(self) -> float:  # Eq. 5
        return min(self.waste_preserve, self.waste_discard)


@dataclass(frozen=True)
class StepDecision:
    """What a policy decided this iteration for paused requests whose KV is on the device; those not
    named stay preserved."""

    swap_out: list[str] = field(default_factory=list)
    discard: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SwapQueue:
    """How soon a swap-out that misses this iteration's budget could start (our extension, for
    `min_waste_deferred`): the copies ahead of it drain at N_i tokens per iteration, swap-ins first
    (the budget favours them), then the swap-outs under way, then those chosen or deferred before it."""

    tokens_ahead: int  # swap-in tokens still to copy + swap-out tokens under way
    limit_tokens: int  # N_i: tokens one iteration moves, both directions together
    step_s: float  # one iteration's time
    block_size: int

    def wait_s(self, blocks_ahead: int) -> float:
        """Time until a copy with `blocks_ahead` blocks planned before it starts: the iterations that
        move those ahead of it (this one included), at least the next one's."""
        tokens = self.tokens_ahead + blocks_ahead * self.block_size
        return max(1, -(-tokens // max(self.limit_tokens, self.block_size))) * self.step_s


def infercept_plan(costs: Sequence[PausedCost], swap_out_budget_blocks: int, host_free_blocks: int,
                   queue: SwapQueue | None = None) -> StepDecision:
    """The paper's per-iteration choice: sort paused requests by their minimum waste, largest first;
    swap out from the top while the swap-out budget and the host buffer allow; preserve or discard the
    rest, whichever wastes less. A request bigger than one iteration's budget still starts swapping
    (its copy continues over the next iterations) when it is first in line and the budget is unused,
    so large contexts are not starved.

    With `queue` (our extension), a request that only missed this iteration's budget is not compared
    against preserving it for its whole call, as the paper does: a discard is final, but a preserved
    request is decided again next iteration, when the budget may reach it. It stays preserved while
    its whole hold (since the pause, plus the wait for its copy to start) wastes less than recomputing
    it, and the call still outlasts the copy's round trip after that wait; otherwise the paper's
    choice applies. Counting the hold since the pause bounds the waiting: a request that later
    arrivals keep overtaking is not held for longer than its recompute would cost."""
    swap, discard = [], []
    budget, host = swap_out_budget_blocks, host_free_blocks
    ahead_blocks = 0  # blocks chosen or deferred this iteration, ahead of the next candidate
    deferred_host = 0  # host slots the deferred ones will need (not taken from swaps that start now)
    for c in sorted(costs, key=lambda c: c.waste, reverse=True):
        first_in_line = budget == swap_out_budget_blocks and budget > 0
        wants_swap = c.swap_worthwhile and c.waste > 0
        if wants_swap and c.context_blocks <= host and (c.context_blocks <= budget or first_in_line):
            swap.append(c.request_id)
            budget -= min(budget, c.context_blocks)
            host -= c.context_blocks
            ahead_blocks += c.context_blocks
            continue
        if wants_swap and queue is not None and c.context_bytes > 0 and c.context_blocks <= host - deferred_host:
            wait = queue.wait_s(ahead_blocks)
            hold = (c.held_s + min(wait, c.remaining_s)) * c.context_bytes  # Eq. 2 over the hold only
            if c.remaining_s - wait > c.round_trip_s and hold < c.waste_discard:
                deferred_host += c.context_blocks  # its copy will need these slots
                ahead_blocks += c.context_blocks
                continue  # preserved for now: swapped once the budget reaches it
        if c.waste_discard < c.waste_preserve:
            discard.append(c.request_id)
    return StepDecision(swap_out=swap, discard=discard)


@dataclass(frozen=True)
class DecisionInput:
    """Everything a per-iteration decision function may use."""

    now_s: float
    paused: Sequence[PausedView]  # preserved on the device, not moving
    profile: Profile
    estimator: DurationEstimator
    block_size: int
    running_tokens: int  # context tokens of the running batch (C_other of Eq. 1 and 4)
    running_requests: int
    # B_i of the swap limit: the tokens the previous iteration scheduled (the paper's), or those the step
    # being built computes (`PolicySpec.swap_budget_from_step`); T_fwd of it is the decisions' step time.
    last_batch_tokens: int
    swap_out_budget_tokens: int
    host_free_blocks: int
    # For `min_waste_deferred`: copies under way or queued ahead of new swap-outs (swap-ins still to
    # copy in, swap-outs still to copy out), and N_i, the tokens one iteration moves.
    swap_queue_tokens: int = 0
    swap_limit_tokens: int = 0
    # For `min_waste_slack`: device blocks left free once the step being built has what it needs (its
    # running requests and the waiting head's admission; None: not known), and whether that head waits for
    # blocks (then memory is short whatever is free).
    free_blocks: int | None = None
    head_waits: bool = False


def paused_costs(inp: DecisionInput) -> list[PausedCost]:
    """Eq. 2 and Eq. 4 for every paused request of the input."""
    prof, est = inp.profile, inp.estimator
    chunk = recompute_chunk_tokens(prof, inp.running_requests)
    costs = []
    for v in inp.paused:
        ctx = v.context_tokens
        blocks = swapped_blocks(ctx, inp.block_size)
        remaining = est.remaining_s(v.aug_type, inp.now_s - v.paused_at_s, v.expected_duration_s)
        moved = blocks * inp.block_size
        round_trip = prof.t_swap_out_s(moved) + prof.t_swap_in_s(moved)
        # A discard is charged its whole context, prefix cache or not (`infercept-apc`): its freed blocks
        # stay hittable only until reused, and under the memory pressure that makes a discard worth
        # choosing they are reused first; counting them would make every discard look nearly free.
        costs.append(PausedCost(
            request_id=v.request_id,
            context_blocks=blocks,
            waste_preserve=waste_preserve_byte_s(remaining, ctx, prof.kv_bytes_per_token),
            waste_discard=waste_chunked_discard_byte_s(prof, ctx, inp.running_tokens, chunk),
            swap_worthwhile=remaining > round_trip + prof.t_fwd_s(max(1, inp.last_batch_tokens)),
            remaining_s=remaining,
            round_trip_s=round_trip,
            held_s=max(0.0, inp.now_s - v.paused_at_s),
            context_bytes=ctx * prof.kv_bytes_per_token,
        ))
    return costs


def min_waste(inp: DecisionInput) -> StepDecision:
    """The InferCept policy's decision function (Eq. 2, 4, 5 with the swap budget of Sec. 4.2)."""
    return infercept_plan(paused_costs(inp), inp.swap_out_budget_tokens // inp.block_size, inp.host_free_blocks)


def renting(c: PausedCost, host_free_blocks: int) -> bool:
    """Whether a paused request is still in its ski-rental hold: its swap would pay off (the call is
    expected to outlast the copy's round trip, and the host buffer has room for it now) but it has been
    held idle for less than that round trip. Without room there is no swap to rent towards: the
    min-waste choice (preserve or discard) applies at once.

    Why hold it: keeping the KV one round trip costs at most the memory-time the swap itself costs
    (C x M x the round trip), so a call that turns out long costs at most twice its swap (the
    deterministic ski-rental bound), while calls shorter than a round trip, which a swap would only
    delay (their resume waits for the copy back in) and whose copies take the per-iteration budget
    from long calls, are not copied (memory pressure still may: `InterceptCore.demote`). The estimate alone cannot tell them apart: a log-normal call
    type's mean residual life sits above the round trip at the pause although most of its calls end
    before it (ALFWorld at 25 GB/s: most calls ~0.09 s, round trips 48-80 ms). The paper's elapsed-time
    estimate has this hold built in (its remaining time is 0 at the pause); here the profile's link
    sets it, whatever the estimator."""
    return c.swap_worthwhile and c.context_blocks <= host_free_blocks and c.held_s < c.round_trip_s


def min_waste_deferred(inp: DecisionInput) -> StepDecision:
    """`min_waste`, except that
    * a request that only missed this iteration's swap budget waits for it when that wastes less than
      a recompute (`infercept_plan` with a `SwapQueue`). The paper compares a discard against
      preserving for the whole call; with a budget sized to the forward window, copies are under way
      in most iterations, so that rule recomputed most long calls that paused meanwhile;
    * a request whose swap would pay off is kept, neither swapped nor discarded, while it is `renting`
      (memory pressure still demotes it: `InterceptCore.demote`): at paper scale (GPT-J-6B,
      A100 profile) swapping short ALFWorld calls at the pause used up the swap budget and the long
      calls that then missed it were recomputed (the max rate at the SLO 3.75 req/s against 4.0 with
      the hold, median of three seeds: `results/sim/paper_ranking/infercept_without_hold.json` and
      `results/sim/paper_scale.json`)."""
    return _deferred_plan(inp, paused_costs(inp))


def _deferred_plan(inp: DecisionInput, costs: Sequence[PausedCost]) -> StepDecision:
    """`min_waste_deferred` over costs already computed (`min_waste_slack` passes those it does not keep)."""
    queue = SwapQueue(
        tokens_ahead=inp.swap_queue_tokens, limit_tokens=inp.swap_limit_tokens,
        step_s=inp.profile.t_fwd_s(max(1, inp.last_batch_tokens)), block_size=inp.block_size,
    )
    costs = [c for c in costs if not renting(c, inp.host_free_blocks)]
    return infercept_plan(costs, inp.swap_out_budget_tokens // inp.block_size, inp.host_free_blocks, queue)


def slack_kept(costs: Sequence[PausedCost], inp: DecisionInput) -> set[str]:
    """The paused requests whose KV no one needs before it could still be moved: kept in place, undecided,
    this iteration (`min_waste_slack`).

    Eq. 2 charges a preserved context its memory-time whether or not anyone wants the memory; while the
    device has blocks left over, keeping it costs nothing, and swapping it out or recomputing it only
    delays its resume. It is kept while nothing waits for blocks and the blocks left free cover what the
    running batch grows (a token per request per step) while the kept contexts could still be copied out,
    one after the other (each at the link's rate and within N_i a step), should memory run short: that is
    when the next iteration decides them as `infercept` would. Least memory-time first (context x the
    call's expected remaining time), since those cost least if memory does run short."""
    if inp.free_blocks is None or inp.head_waits or inp.free_blocks <= 0:
        return set()
    prof, bs = inp.profile, inp.block_size
    step_s = prof.t_fwd_s(max(1, inp.last_batch_tokens))
    grow_blocks_per_s = inp.running_requests / step_s / bs
    kept: set[str] = set()
    react_s = 0.0
    for c in sorted(costs, key=lambda c: (c.remaining_s * c.context_blocks, c.request_id)):
        tokens = c.context_blocks * bs
        steps = -(-tokens // inp.swap_limit_tokens) if inp.swap_limit_tokens > 0 else 1
        react_s += max(prof.t_swap_out_s(tokens), steps * step_s)
        if math.ceil(grow_blocks_per_s * react_s) > inp.free_blocks:
            break
        kept.add(c.request_id)
    return kept


def min_waste_slack(inp: DecisionInput) -> StepDecision:
    """`min_waste_deferred` over the paused requests that `slack_kept` does not keep in place: while the
    device's memory is slack, a paused context stays where it is (as `preserve` would keep it), so that
    its resume needs neither a copy back nor a recompute; once memory is short it is decided as
    `infercept` decides it."""
    costs = paused_costs(inp)  # once: the kept ones are only left out of the plan
    kept = slack_kept(costs, inp)
    return _deferred_plan(inp, [c for c in costs if c.request_id not in kept])


def swap_long_calls(inp: DecisionInput) -> StepDecision:
    """The paper's preserve heuristic with budgeted swap (an ablation step before min-waste): keep the
    KV of calls expected back before a copy out and in could finish, swap the others within the swap
    budget (largest first), and never discard by choice."""
    costs = [c for c in paused_costs(inp) if c.swap_worthwhile]
    budget, host, swap = inp.swap_out_budget_tokens // inp.block_size, inp.host_free_blocks, []
    first = True
    for c in sorted(costs, key=lambda c: c.context_blocks, reverse=True):
        if c.context_blocks <= host and (c.context_blocks <= budget or (first and budget > 0)):
            swap.append(c.request_id)
            budget -= min(budget, c.context_blocks)
            host -= c.context_blocks
            first = False
    return StepDecision(swap_out=swap)


@dataclass(frozen=True)
class PrefetchInput:
    """What a prefetch decision may know. Views are paused requests whose KV is on the host (`swapped`)
    or on its way back or back ahead of the return (`fetched`); `paused_at_s` and the durations as for
    `PausedView`."""

    now_s: float
    swapped: Sequence[PausedView]
    fetched: Sequence[PausedView]
    estimator: DurationEstimator
    profile: Profile
    block_size: int
    step_s: float  # one iteration's time
    spare_blocks: int  # link capacity this iteration leaves unused (blocks): what prefetches may move
    pipeline_blocks: int  # blocks prefetches under way still have to move
    room_blocks: int  # device blocks free beyond what this step and the queue's head need
    min_p: float  # fetch when the call is at least this likely to be back by the time the copy is done
    free_slots: int = 1 << 30  # running slots a prefetch may take (each takes one)


@dataclass(frozen=True)
class PrefetchDecision:
    start: list[str] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)


def prefetch_horizon_s(blocks: int, inp: PrefetchInput) -> float:
    """How long copying a context back takes: its chunks at the spare rate (the link's own time at the
    least), plus the step that reports it done."""
    link_s = inp.profile.t_swap_in_s(blocks * inp.block_size)
    steps = -(-blocks // inp.spare_blocks) if inp.spare_blocks > 0 else 0
    return max(link_s, steps * inp.step_s) + inp.step_s


def prefetch_plan(inp: PrefetchInput) -> PrefetchDecision:
    """Our extension (KVFlow, Tokencake: upload ahead of the predicted return). A swapped context is
    copied back, with link capacity the iteration leaves unused and device blocks nobody needs now, when
    its call is likely (`min_p`) to be over by the time the copy is: the resume then finds its KV on the
    device instead of waiting for a load. A fetched-back context keeps its host copy, so giving it up
    costs nothing but the copy: when its call now looks unlikely to be back soon (below half of
    `min_p`: hysteresis), or when memory runs short (`InterceptCore.demote`).

    Starts are most likely back first, while the copies under way leave the link idle within a step
    (`pipeline_blocks` under `spare_blocks`), so a fetch started now starts moving now."""
    est = inp.estimator
    drop = []
    for v in inp.fetched:
        blocks = swapped_blocks(v.context_tokens, inp.block_size)
        p = est.back_within_p(v.aug_type, inp.now_s - v.paused_at_s, prefetch_horizon_s(blocks, inp), v.expected_duration_s)
        if p < inp.min_p / 2:
            drop.append(v.request_id)
    start: list[str] = []
    if inp.spare_blocks <= 0 or inp.room_blocks <= 0 or inp.free_slots <= 0:
        return PrefetchDecision(start, drop)
    scored = []
    for v in inp.swapped:
        blocks = swapped_blocks(v.context_tokens, inp.block_size)
        p = est.back_within_p(v.aug_type, inp.now_s - v.paused_at_s, prefetch_horizon_s(blocks, inp), v.expected_duration_s)
        if p >= inp.min_p and blocks > 0:
            scored.append((-p, v.paused_at_s, blocks, v.request_id))
    room, pipeline = inp.room_blocks, inp.pipeline_blocks
    for _, _, blocks, rid in sorted(scored):
        if pipeline >= inp.spare_blocks or len(start) >= inp.free_slots:
            break
        if blocks > room:
            continue
        start.append(rid)
        room -= blocks
        pipeline += blocks
    return PrefetchDecision(start, drop)
