"""The intercept core: the one owner of everything about paused requests.

It owns the entries (where each paused request's KV lives: `state.KvState`), the ledger, the waste
meter, the swap planner and the call-duration estimator, and applies the policy (`policy.table`).
One method per transition; each checks the state it starts from. It is pure bookkeeping: the KV pool
is reached through a `KvPort` (vLLM's scheduler in the engine, a simulated pool in the simulator),
and the engine's clock is passed in.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from engine_adapter.intercept.meter import AdmissionMeter, WasteMeter
from engine_adapter.intercept.records import Fate, InterceptRecord, Ledger
from engine_adapter.intercept.state import (
    Entry,
    KvPort,
    KvState,
    PauseInfo,
    Resume,
    ResumeKind,
    StepView,
)
from engine_adapter.intercept.step import StepLimits, StepRequest, new_first
from engine_adapter.intercept.swap import StepCopies, SwapPlanner
from engine_adapter.policy.decide import (
    DecisionInput,
    PausedView,
    PrefetchInput,
    continuum_ttl_s,
    demotion_order,
    prefetch_plan,
    ttl_expired,
    ttl_for,
)
from engine_adapter.policy.estimator import DurationEstimator
from engine_adapter.policy.profile import Profile
from engine_adapter.policy.table import Action, PolicySpec, pause_action
from engine_adapter.policy.waste import waste_chunked_discard_byte_s


class TransitionError(AssertionError):
    """A transition was asked of an entry in a state it cannot start from (a bug, not bad input)."""


@dataclass(frozen=True)
class CoreSettings:
    ttl_s: Mapping[str, float]
    demotion_reserve_blocks: int = 0  # free blocks kept beyond the next step's need before demoting
    # A swap-out gives its device blocks back in the step that copies its last blocks (the workers read
    # reused blocks before the forward pass writes them), not one step later, as InferCept on vLLM v0
    # does. Off for engines that zero newly allocated blocks before the forward (their zeroing would run
    # before the copy).
    release_when_copied: bool = True
    # Policies with `new_first`: how many consecutive steps one blocked resumed head may be passed over by
    # new requests before the queue is first-come-first-served again for it (so it cannot starve).
    new_first_max_steps: int = 128
    # Policies with `prefetch`: copy a swapped context back once its call is at least this likely to be over
    # by the time the copy is (`decide.prefetch_plan`).
    prefetch_min_p: float = 0.5


class InterceptCore:
    def __init__(self, spec: PolicySpec, kv: KvPort, *, block_size: int, profile: Profile,
                 estimator: DurationEstimator, settings: CoreSettings, swap: SwapPlanner | None = None) -> None:
        if spec.swap and swap is None:
            raise ValueError(f"policy {spec.name!r} needs a swap planner (host buffer)")
        self.spec, self.kv, self.block_size = spec, kv, block_size
        self.profile, self.estimator, self.settings, self.swap = profile, estimator, settings, swap
        self.ledger = Ledger()
        self.meter = WasteMeter(profile.kv_bytes_per_token)
        self.admission = AdmissionMeter()  # fed by the engine's scheduler (vLLM's queue is not the core's)
        self.entries: dict[str, Entry] = {}
        self.request_of: dict[str, str] = {}  # session id -> its request id (sessions that paused)
        self.outbox: dict[str, list[InterceptRecord]] = {}  # records the front end has yet to see
        self._abandoned: list[str] = []  # closed while loading: vLLM frees their blocks once reported
        self._released_now: set[int] = set()  # device blocks of swap-outs released in the step being built
        # Prefetch: contexts whose copy out finishes in the step being built (their host slots are still being
        # written) and fetched-back contexts given back in it (taken again, they would thrash): not fetched now.
        self._not_fetched_now: set[str] = set()
        self._seq = 0
        self.steps = 0  # steps vLLM built (schedule calls), empty ones included
        # Where an engine step's time goes besides the forward pass (`reports.STEP_PARTS`, seconds summed over
        # steps): timed by vLLM's scheduler, which sets it; None in the simulator, whose clock is the cost model.
        self.step_parts_s: dict[str, float] | None = None
        self.passed_over_steps = 0  # steps whose new requests went ahead of a blocked resumed head
        self._last_running_tokens = 0  # the running batch's context at the last step (continuum's reload cost)
        self._budget_batch = 1  # B_i the step's swap budget was sized to (`_plan_swaps`)
        self._passed_over: tuple[str, int] | None = None  # (blocked resumed head, steps it was passed over)
        # Read-only watchers (experiments, tracing): called after every change of an entry's KvState, with
        # the engine's clock where the transition has one (None for the copies the workers report). They
        # must not change the entry; the core never reads what they do.
        self.observers: list[Callable[[Entry, float | None], None]] = []

    # ================================================================== transitions
    def pause(self, info: PauseInfo, now: float) -> InterceptRecord:
        """A request parked at a trigger or the end of a turn (its KV and running slot are held)."""
        if info.request_id in self.entries:
            old = self.entries[info.request_id]
            raise TransitionError(f"{info.request_id} paused twice: it is {old.state.value} since {old.record}")
        ttl = self._ttl_s(info) if self.spec.ttl else None
        action = pause_action(self.spec, ttl)
        rec = self.ledger.pause(
            session_id=info.session_id, request_id=info.request_id, aug_type=info.aug_type, trigger=info.trigger,
            tool=info.tool, policy=self.spec.name, context_tokens=info.context_tokens, paused_at_s=now,
            expected_duration_s=info.expected_duration_s, ttl_s=ttl, arrival_time=info.arrival_time, action=action.value,
        )
        e = Entry(info.request_id, rec, KvState.PRESERVED, self._next_seq())
        self.entries[e.request_id] = e
        self.request_of[info.session_id] = info.request_id
        self._moved(e, now)
        if action is Action.DISCARD:
            self.free(e, Fate.DISCARD, now)
        elif action is Action.SWAP:
            self.start_swap_out(e, now)
        self._post(rec)
        return rec

    def _ttl_s(self, info: PauseInfo) -> float:
        """How long a ttl policy keeps this pause's KV: the engine's per-type table, or (continuum) the
        time-to-live that minimizes the expected cost over the tool's observed durations."""
        if not self.spec.ttl_online:
            return ttl_for(self.settings.ttl_s, info.aug_type)
        prof = self.profile
        # The recompute the context would cost, chunked as the engine would recompute it (Eq. 4).
        chunk = max(16, min(prof.saturation_tokens, info.context_tokens))
        reload = waste_chunked_discard_byte_s(prof, info.context_tokens, self._last_running_tokens, chunk)
        return continuum_ttl_s(self.estimator.samples(info.aug_type), info.context_tokens, prof.kv_bytes_per_token, reload)

    def free(self, e: Entry, fate: Fate, now: float) -> None:
        """Discard, expire or demote: the device blocks and the running slot go back; a copy to the
        host in progress is dropped."""
        self._expect(e, KvState.PRESERVED, KvState.SWAPPING_OUT)
        if e.host is not None:
            self._drop_host(e)
        self.kv.release(e.request_id)
        e.state = KvState.DISCARDED
        self.ledger.release_kv(e.record, fate, now)
        self._moved(e, now)

    def start_swap_out(self, e: Entry, now: float) -> bool:
        """Reserve host slots for the context's blocks and queue the copy; a full host buffer falls back
        to discard."""
        self._expect(e, KvState.PRESERVED)
        assert self.swap is not None
        host = self.swap.reserve(e.context_tokens)
        if host is None:
            if e.context_tokens > 0:
                self.ledger.totals.swap_fallbacks += 1
            self.free(e, Fate.DISCARD, now)
            return False
        e.host, e.state, e.seq = host, KvState.SWAPPING_OUT, self._next_seq()
        self._moved(e, now)
        return True

    def finish_swap_out(self, e: Entry, now: float) -> None:
        """Its last blocks are copied in the step being built (`release_when_copied`) or were copied in a
        step that has run: the device copy can go."""
        self._expect(e, KvState.SWAPPING_OUT)
        assert e.host is not None and e.host.out_complete
        self.kv.release(e.request_id)
        e.state = KvState.SWAPPED
        self.ledger.release_kv(e.record, Fate.SWAP, now, moved_tokens=e.host.tokens)
        self._moved(e, now)

    def resume(self, request_id: str, now: float, new_arrival_time: float) -> Resume | None:
        """The session's next input arrived. None: the request never paused under this core."""
        self.expire(now)  # the engine does not step while only paused requests exist
        e = self.entries.get(request_id)
        if e is None:
            return None
        self._expect(e, KvState.PRESERVED, KvState.SWAPPING_OUT, KvState.SWAPPED, KvState.DISCARDED,
                     KvState.PREFETCHING, KvState.PREFETCHED)
        arrival = e.arrival_time if self.spec.keep_arrival_time else new_arrival_time
        self.estimator.observe(e.aug_type, now - e.paused_at_s)
        self.ledger.resume(e.record, now, arrival)
        if e.state in (KvState.PREFETCHED, KvState.PREFETCHING):
            self._end_fetch(e, now)
        if e.state is KvState.PREFETCHED:
            # Fetched back ahead of the return: the KV is on the device; it came back by a swap-in.
            assert e.host is not None
            tokens = e.host.tokens
            self._drop_host(e)
            del self.entries[request_id]
            self.ledger.swapped_in(e.record, tokens)
            self.ledger.totals.prefetch_hits += 1
            self._moved(e, now)
            self._post(e.record)
            return Resume(ResumeKind.KEEP, arrival)
        if e.state is KvState.PREFETCHING:
            # Back before the prefetch finished: its blocks are held, the rest of the copy follows.
            e.state, e.seq = KvState.LOADING, self._next_seq()
            self.ledger.totals.prefetch_late += 1
            self._moved(e, now)
            return Resume(ResumeKind.LOAD_IN_PLACE, arrival)
        if e.state.on_device:
            # Back before any copy finished: the device blocks are still there, keep using them.
            if e.host is not None:
                self._drop_host(e)
            del self.entries[request_id]
            self._post(e.record)
            return Resume(ResumeKind.KEEP, arrival)
        e.seq = self._next_seq()
        if e.state is KvState.SWAPPED:
            e.state = KvState.LOAD_QUEUED
            self._moved(e, now)
            return Resume(ResumeKind.LOAD, arrival)
        e.state = KvState.RECOMPUTE_QUEUED
        self._moved(e, now)
        return Resume(ResumeKind.RECOMPUTE, arrival)

    def close(self, request_id: str, now: float) -> None:
        """The request ended (session closed or aborted) in whatever state."""
        self.outbox.pop(request_id, None)
        self.meter.forget(request_id)
        e = self.entries.pop(request_id, None)
        if e is None:
            return
        if self.request_of.get(e.session_id) == request_id:
            del self.request_of[e.session_id]
        if e.state is KvState.LOADING:
            # vLLM holds its allocated blocks until the load is reported finished: report it (an armed
            # request has no blocks yet, and vLLM would not know a report for it).
            self._abandoned.append(request_id)
        if e.host is not None:
            self._drop_host(e)
        self._end_fetch(e, now)
        self.ledger.close(e.record, now)

    def expire(self, now: float) -> None:
        """The ttl policy: preserved KV whose time-to-live has passed is freed (accounted up to the
        moment it expired, not to when it was noticed)."""
        if not self.spec.ttl:
            return
        for rid, when in ttl_expired(self._views(KvState.PRESERVED), now):
            self.free(self.entries[rid], Fate.TTL_EXPIRED, min(now, when))

    def demote(self, view: StepView, now: float) -> None:
        """Give preserved KV (and running slots) back when running or resumed work needs them, so a
        paused request can never starve the batch. Paused requests expected back last go first.

        Under a policy that swaps under pressure, room is made by copying those contexts to the host
        instead of freeing them, and ahead of need: as soon as the prompts and recomputes under way
        (and the head of the queue's) will not fit in what is free plus what copies under way give
        back (`StepView.blocks_ahead`). The head waits the few steps a copy takes, and the contexts
        come back by a swap-in instead of a recompute. Only what the running requests need this
        step is freed at once (vLLM would preempt one of them otherwise), and only while something
        runs (copies are shipped with a step's forward pass)."""
        head = view.head_waiting
        # Brand-new requests may wait for preserved KV (the preserve policy's cost), unless nothing
        # runs, in which case waiting would be a deadlock.
        wants_room = head is not None and (head in self.request_of.values() or view.running_requests == 0)
        head_need = self._head_need(view)
        load_extra = head_need - view.head_blocks
        reserve = view.blocks_needed + load_extra + self.settings.demotion_reserve_blocks
        # The host buffer pressure swaps go to (None: this policy or this step demotes).
        swap = self.swap if self.spec.swap_under_pressure and view.running_requests > 0 else None
        may_wait = swap is not None
        now_need = reserve - head_need  # the running requests' blocks this step
        target = max(reserve, view.blocks_ahead + self.settings.demotion_reserve_blocks) if may_wait else reserve
        # Blocks and slots that copies already under way give back within a few steps.
        moving = [e for e in self.entries.values() if e.state is KvState.SWAPPING_OUT]
        coming_blocks = sum(len(self.kv.block_ids(e.request_id)) for e in moving) if may_wait else 0
        coming_slots = len(moving)
        # Contexts fetched back ahead of their return keep their host copy: giving their blocks and slots
        # back costs nothing but the copy, so they go before any preserved KV.
        def fetched_room_met() -> bool:
            return self.kv.num_free_blocks() >= target and not (head is not None and self.kv.slots_full())

        if not fetched_room_met():
            fetched = [v for st in (KvState.PREFETCHED, KvState.PREFETCHING) for v in self._views(st)]
            for rid in demotion_order(self._with_expected(fetched)):
                if fetched_room_met():
                    break
                self._unprefetch(self.entries[rid], now)

        def room_met() -> bool:
            free = self.kv.num_free_blocks()
            short_of_slots = wants_room and self.kv.slots_full()
            if not may_wait:
                return free >= reserve and not short_of_slots
            # the copies under way make the room: the head waits for them
            return free >= now_need and free + coming_blocks >= target and not (short_of_slots and coming_slots == 0)

        # (The order is built only when something must go: it is asked every step.)
        for rid in demotion_order(self._with_expected(self._views(KvState.PRESERVED))) if not room_met() else ():
            if room_met():
                break
            free = self.kv.num_free_blocks()
            met_now = free >= reserve and not (wants_room and self.kv.slots_full())
            if rid == head:
                continue
            e = self.entries[rid]
            if swap is not None and free >= now_need and swap.fits(e.context_tokens):
                coming_blocks += len(self.kv.block_ids(rid))
                coming_slots += 1
                self.start_swap_out(e, now)
                self.ledger.totals.pressure_swaps += 1
                continue
            if met_now:
                break  # only room ahead is missing, and the host cannot take this context: keep it
            self.free(e, Fate.DEMOTED, now)
        # A request copying out is freed within a few steps anyway, so it is given back only when the
        # running requests still lack blocks for this very step (vLLM would preempt one of them, a
        # worse loss): the copies that moved least go first.
        for e in sorted(moving, key=lambda e: e.host.copied_out / max(1, len(e.host.slots)) if e.host else 0.0):
            if self.kv.num_free_blocks() >= now_need:
                break
            if e.request_id != head:
                self.free(e, Fate.DEMOTED, now)

    def unblock(self, view: StepView, now: float) -> None:
        """Nothing runs, and the head of the queue cannot be admitted because waiting requests hold the
        blocks it needs: sessions resumed in place and finished swap-ins (no longer paused, so demotion
        cannot touch them). vLLM admits nothing past a head that does not fit and preempts only running
        requests, so no step would ever change this: a deadlock. Free the newest such holders' blocks,
        until the head fits, as vLLM's preemption frees the newest running request's: they are
        recomputed (prefix-cache hits aside) when their turn comes. Copies to the host under way give
        blocks back by themselves, so nothing is evicted while one is."""
        head = view.head_waiting
        if view.running_requests or head is None:
            return
        if any(e.state is KvState.SWAPPING_OUT for e in self.entries.values()):
            return
        need = self._head_need(view)
        for rid in reversed(self.kv.kv_holding_waiting()):
            if self.kv.num_free_blocks() >= need:
                return
            if rid == head:
                continue
            e = self.entries.get(rid)
            if e is not None and e.state is KvState.LOADED:  # a finished swap-in: recomputed instead
                if e.host is not None:
                    self._drop_host(e)
                e.state = KvState.RECOMPUTE_QUEUED
                self._moved(e, now)
            elif e is not None and e.state is not KvState.RECOMPUTE_QUEUED:
                continue  # (no other resumed state holds blocks while ready) not this core's to judge
            # RECOMPUTE_QUEUED with blocks: a prefix loaded from a host tier (vllm-offload's connector);
            # it is recomputed from what the prefix cache still holds.
            self.kv.evict_waiting(rid)
            self.ledger.totals.waiting_evictions += 1

    def _head_need(self, view: StepView) -> int:
        """Free blocks the head of the queue needs to be admitted: a swap-in head allocates blocks for its
        whole host copy at once, not one chunk's worth."""
        head = view.head_waiting
        load = self.entries[head].load_blocks if head in self.entries else 0
        return view.head_blocks + max(0, load - view.head_blocks)

    def tag(self, session_id: str, aug_type: str, expected_duration_s: float | None) -> bool:
        """Refine a session's current pause (the caller may know more, e.g. an oracle duration)."""
        e = self.entries.get(self.request_of.get(session_id, ""))
        if e is None or not e.state.paused:
            return False
        e.record.aug_type, e.record.expected_duration_s = aug_type, expected_duration_s
        return True

    # ================================================================== per iteration
    def before_schedule(self, step_view: Callable[[], StepView], now: float) -> int | None:
        """Everything due before vLLM builds a step. `step_view` is asked only when needed (it walks
        the queues). Returns the step's token budget when the policy caps iterations at the
        saturation point (None: leave vLLM's)."""
        view = _Lazy(step_view)
        self.steps += 1
        self._not_fetched_now.clear()
        if self.spec.ttl_online:
            self._last_running_tokens = view.get().running_tokens
        if self.swap is not None:
            self._settle(now)
        self.expire(now)
        if any(e.state.on_device for e in self.entries.values()):
            self.demote(view.get(), now)
        if self.kv.kv_holding_waiting():
            self.unblock(view.get(), now)
        if self.swap is not None:
            self._plan_swaps(view, now)
        if self.spec.chunk_at_saturation:
            # Chunked recompute (and prefill): fill each iteration up to S and no further; past S more
            # tokens only lengthen the iteration (paper Sec. 4.3). Never above the engine's own budget.
            return max(self.profile.saturation_tokens, view.get().running_requests + 1)
        return None

    def waiting_order(self, waiting: Iterable[StepRequest], free_blocks: int, limits: StepLimits) -> list[str]:
        """Requests of the waiting queue (in its order, ready ones only) to move to its front before vLLM
        builds the step: with `new_first`, the new requests when a resumed head cannot be admitted
        (`step.new_first`), for at most `new_first_max_steps` steps of the same head."""
        if not self.spec.new_first:
            return []
        queue = list(waiting)
        if not queue:
            self._passed_over = None
            return []
        head = queue[0]
        new_ids = [r.request_id for r in queue if r.request_id not in self.entries and r.num_computed_tokens == 0]
        move = new_first(head, new_ids, free_blocks, limits)
        if not move:
            self._passed_over = None
            return []
        steps = self._passed_over[1] + 1 if self._passed_over and self._passed_over[0] == head.request_id else 1
        self._passed_over = (head.request_id, steps)
        if steps > self.settings.new_first_max_steps:
            return []
        self.passed_over_steps += 1
        return move

    def scheduled(self, new_requests: Iterable[tuple[str, int]], total_tokens: int) -> None:
        """vLLM built a step: the first schedule of a resumed request tells how its context came back
        (its computed tokens then are what was loaded or hit in the prefix cache)."""
        for rid, computed in new_requests:
            e = self.entries.get(rid)
            if e is None or e.state.paused or e.state is KvState.LOAD_QUEUED:
                continue
            if e.state is KvState.RECOMPUTE_QUEUED:
                self.ledger.recomputed(e.record, computed)
            elif e.state is KvState.LOAD_ARMED:
                # Armed, and vLLM asked for nothing: its prefix cache held every block the host copy had
                # (`infercept-apc`), or it reads no external KV for this request (`skip_reading_prefix_cache`).
                if e.host is not None:
                    self._drop_host(e)
                self.ledger.recomputed(e.record, computed)
            else:
                if e.host is not None:  # loaded, not settled yet: its host slots go back now
                    self._drop_host(e)
                self.ledger.swapped_in(e.record, computed, prefix_hit=e.load_hit_tokens)
            self.meter.start_recompute(rid, e.record.tokens_recomputed or 0)
            del self.entries[rid]
            self._post(e.record)
        if self.swap is not None:
            self.swap.last_batch_tokens = max(1, total_tokens)

    def step_done(self, seconds: float, scheduled: Mapping[str, int], resident_tokens: int,
                  stall_s: float | None = None, window_s: float | None = None) -> None:
        """One iteration ran: refine T_fwd, and meter the waste it carried. `stall_s`: what the step's
        swap copies added to it, where the workers measured it; otherwise it is estimated from the
        profile's bandwidth. A measured stall is not forward time, so T_fwd learns without it (the
        swap budget hides copies behind T_fwd: counting stalls in it would grow the budget, and with
        it the stalls). `window_s`: the workers' forward window, the part of the step copies can hide
        behind (the swap budget learns its share of the step)."""
        measured = stall_s is not None
        if stall_s is None:
            stall_s = self.swap.last_step_stall_s(seconds) if self.swap else 0.0
            forward_s = seconds
        else:
            stall_s = min(max(0.0, stall_s), seconds)
            forward_s = seconds - stall_s
        self.profile.observe(sum(scheduled.values()), forward_s)
        if window_s is not None and self.swap is not None:
            self.swap.observe_overlap(window_s, forward_s)
        self.meter.iteration(seconds, scheduled, resident_tokens, stall_s, stall_measured=measured)

    # ================================================================== the swap-in path (KV connector)
    def load_lookup(self, request_id: str, num_computed_tokens: int) -> tuple[int | None, bool]:
        """vLLM's external-KV lookup for a waiting request: (tokens to load, asynchronously?). None
        holds it back: its KV is on the host but the swap-in budget has not armed it yet."""
        if self.holds_back(request_id):
            return None, False
        e = self.entries.get(request_id)
        if e is None or e.host is None:
            return 0, False
        if e.state is KvState.LOAD_ARMED:
            n = max(0, e.host.tokens - num_computed_tokens)
            return n, n > 0
        return 0, False

    def holds_back(self, request_id: str) -> bool:
        """Whether `load_lookup` holds this waiting request back (its swap-in not armed yet): vLLM skips it."""
        e = self.entries.get(request_id)
        return e is not None and e.host is not None and e.state is KvState.LOAD_QUEUED

    def load_allocated(self, request_id: str, block_ids: list[int], num_external_tokens: int) -> None:
        """vLLM allocated the device blocks the host copy goes into."""
        e = self.entries.get(request_id)
        if e is None or e.state is not KvState.LOAD_ARMED or num_external_tokens == 0:
            return
        assert e.host is not None
        n = len(e.host.slots)
        # With prefix caching the request's first blocks may be hits (vLLM's lookup ran before ours, in
        # whole blocks): the load fills only the blocks from the first one the device lacks.
        skip = n - -(-num_external_tokens // self.block_size)
        if len(block_ids) < n or skip < 0:
            raise TransitionError("vLLM allocated fewer blocks than the swapped context needs")
        e.host.to_load = deque(zip(block_ids[skip:n], e.host.slots[skip:]))
        e.host.hit_tokens = e.load_hit_tokens = max(0, e.host.tokens - num_external_tokens)
        e.state = KvState.LOADING
        self._moved(e, None)

    def step_copies(self) -> StepCopies:
        """The copies of the step being built (the connector ships them to the workers)."""
        assert self.swap is not None
        loading = self._ordered(KvState.LOADING)
        fetching = self._ordered(KvState.PREFETCHING)  # after the loads the resumes wait for
        # Asked after the engine allocated the step: released blocks it handed out again are copied
        # before the forward pass writes them.
        reused = self.kv.in_use(self._released_now) if self._released_now else set()
        self._released_now = set()
        copies = self.swap.take_copies([(e.request_id, e.host) for e in loading if e.host], self._abandoned, reused,
                                       fetching=[(e.request_id, e.host) for e in fetching if e.host])
        self._abandoned = []
        done = set(copies.loads_done)
        for e in loading:
            if e.request_id in done:
                e.state = KvState.LOADED
                self._moved(e, None)
        fetched = {e.request_id for e in fetching if e.request_id in done}
        for e in fetching:
            if e.request_id in fetched:
                e.state = KvState.PREFETCHED
                self._moved(e, None)
        if fetched:  # the engine waits for no prefetch: only loads of resumed requests are reported
            copies = dataclasses.replace(copies, loads_done=[r for r in copies.loads_done if r not in fetched])
        return copies

    # ================================================================== reports
    def holds_device(self, request_id: str) -> bool | None:
        """Whether a paused request still holds its device blocks and running slot (None: not paused)."""
        e = self.entries.get(request_id)
        return None if e is None or not e.state.paused else e.state.on_device

    def paused_ids(self, on_device: bool) -> set[str]:
        """Paused requests that hold their device blocks and running slot, or that released them."""
        return {rid for rid, e in self.entries.items() if e.state.paused and e.state.on_device == on_device}

    # ================================================================== internals
    def _settle(self, now: float) -> None:
        """What the previous steps' copies completed: free the device copy of finished swap-outs, the
        host slots of finished swap-ins."""
        for e in list(self.entries.values()):
            if e.state is KvState.SWAPPING_OUT and e.host is not None and e.host.out_complete:
                self.finish_swap_out(e, now)
            elif e.state is KvState.LOADED and e.host is not None:
                self._drop_host(e)

    def _plan_swaps(self, view: _Lazy, now: float) -> None:
        sw = self.swap
        assert sw is not None
        copying = self._ordered(KvState.SWAPPING_OUT)
        inflight = sum((len(e.host.slots) - e.host.copied_out) * self.block_size for e in copying if e.host)
        candidates = self._views(KvState.PRESERVED) if self.spec.decide is not None else []
        # Every swap-in not yet on the device wants budget: queued ones, and armed or loading ones for the
        # blocks they still have to copy (counting only the queued ones starved the loads already under
        # way to one block per step once the queue emptied).
        under_way = [e for e in self.entries.values() if e.host and e.state in (KvState.LOAD_ARMED, KvState.LOADING)]
        loading = [e.host for e in under_way]  # type: ignore[misc]  # every one has its host copy (filtered above)
        queued_in = [e.host for e in self._ordered(KvState.LOAD_QUEUED) if e.host]
        want_in = sum(h.blocks_to_load for h in queued_in + loading) * self.block_size
        want_out = inflight + sum(sw.blocks(v.context_tokens) for v in candidates) * self.block_size
        # B_i: the batch the copies hide behind (the step being built, or the paper's previous one); the
        # decisions' step time is the same step's, so that their wait for the budget is in its units.
        batch = max(1, view.get().step_tokens) if self.spec.swap_budget_from_step else sw.last_batch_tokens
        self._budget_batch = batch
        # The device room swap-ins need: free blocks, and the blocks loads under way copy into (vLLM gave them
        # those at admission). Counting only the free ones stalled such loads at one block a step whenever
        # memory was short, holding their blocks idle for as many steps.
        room = self.kv.num_free_blocks() + sum(e.host.blocks_to_load for e in under_way
                                               if e.host is not None and e.state is KvState.LOADING)
        budget = sw.budgets(want_out, want_in, room, reserved_out_tokens=inflight, batch_tokens=batch)
        if candidates and self.spec.decide is not None:
            free_after = self.kv.num_free_blocks() - view.get().blocks_needed  # once this step has its blocks
            decision = self.spec.decide(DecisionInput(
                now_s=now, paused=candidates, profile=self.profile, estimator=self.estimator,
                block_size=self.block_size, running_tokens=view.get().running_tokens,
                running_requests=view.get().running_requests, last_batch_tokens=batch,
                swap_out_budget_tokens=max(0, budget.out_tokens - inflight), host_free_blocks=sw.slots.num_free,
                swap_queue_tokens=want_in + inflight,
                swap_limit_tokens=sw.limit_tokens, free_blocks=free_after,
                head_waits=view.get().head_waiting is not None and free_after < 0,
            ))
            for rid in decision.swap_out:
                self.start_swap_out(self.entries[rid], now)
            for rid in decision.discard:
                self.free(self.entries[rid], Fate.DISCARD, now)
        copying = [e for e in self._ordered(KvState.SWAPPING_OUT) if e.host is not None]
        sw.plan_copy_out([(e.host, lambda e=e: self.kv.block_ids(e.request_id)) for e in copying], budget.out_tokens)
        if self.settings.release_when_copied:
            for e in copying:
                if e.host is not None and e.host.out_complete:
                    self._released_now.update(self.kv.block_ids(e.request_id))
                    self.finish_swap_out(e, now)
                    self._not_fetched_now.add(e.request_id)
        queued = self._ordered(KvState.LOAD_QUEUED)
        at_head = bool(queued) and view.get().head_waiting == queued[0].request_id
        for e in queued[:sw.how_many_to_arm([e.host for e in queued if e.host], loading, at_head)]:
            e.state = KvState.LOAD_ARMED
            self._moved(e, now)
        if self.spec.prefetch:
            self._plan_prefetch(view, now)

    def _plan_prefetch(self, view: _Lazy, now: float) -> None:
        """Fetch swapped contexts back ahead of their return with the link capacity this step leaves
        unused (it joins the swap-in budget, loads of resumed requests first) and device blocks nobody
        needs now; give up fetched-back ones whose call now looks long (`decide.prefetch_plan`)."""
        sw = self.swap
        assert sw is not None
        v = view.get()
        need = max(v.blocks_needed + self._head_need(v) - v.head_blocks, v.blocks_ahead) + self.settings.demotion_reserve_blocks
        fetching = self._ordered(KvState.PREFETCHING)
        spare = sw.spare_blocks()
        # A prefetch takes a running slot: it never takes the last one from a request waiting to be admitted.
        slots = self.kv.free_slots() - (1 if v.head_waiting is not None else 0)
        decision = prefetch_plan(PrefetchInput(
            now_s=now, swapped=[s for s in self._views(KvState.SWAPPED) if s.request_id not in self._not_fetched_now],
            fetched=self._views(KvState.PREFETCHING) + self._views(KvState.PREFETCHED),
            estimator=self.estimator, profile=self.profile, block_size=self.block_size,
            step_s=self.profile.t_fwd_s(self._budget_batch), spare_blocks=spare,
            pipeline_blocks=sum(e.host.blocks_to_load for e in fetching if e.host),
            room_blocks=self.kv.num_free_blocks() - need, min_p=self.settings.prefetch_min_p, free_slots=slots,
        ))
        for rid in decision.drop:
            self._unprefetch(self.entries[rid], now)
        for rid in decision.start:
            e = self.entries[rid]
            assert e.host is not None
            blocks = self.kv.reacquire(rid, e.host.tokens)
            if blocks is None:
                break
            n = len(e.host.slots)
            if len(blocks) < n:
                raise TransitionError(f"{rid}: the engine gave {len(blocks)} blocks for a {n}-block prefetch")
            e.host.to_load = deque(zip(blocks[:n], e.host.slots))
            e.state, e.seq, e.fetched_at_s = KvState.PREFETCHING, self._next_seq(), now
            self.ledger.totals.prefetches += 1
            self._moved(e, now)
        if any(e.state is KvState.PREFETCHING for e in self.entries.values()):
            sw.prefetch_blocks = spare

    def _unprefetch(self, e: Entry, now: float) -> None:
        """Give a fetched-back context's device blocks and slot back; its host copy stays (SWAPPED)."""
        self._expect(e, KvState.PREFETCHING, KvState.PREFETCHED)
        assert e.host is not None
        self.kv.release(e.request_id)
        e.host.to_load = None
        e.state = KvState.SWAPPED
        self._not_fetched_now.add(e.request_id)
        self._end_fetch(e, now)
        self.ledger.totals.prefetch_dropped += 1
        self._moved(e, now)

    def _end_fetch(self, e: Entry, now: float) -> None:
        """A prefetch's device blocks stop being held idle (resume, given up, closed): charge the hold."""
        if e.fetched_at_s is not None:
            self.ledger.held_again(e.record, now - e.fetched_at_s)
            e.fetched_at_s = None

    def _drop_host(self, e: Entry) -> None:
        assert self.swap is not None and e.host is not None
        self.swap.release(e.host)
        e.host = None

    def _with_expected(self, views: list[PausedView]) -> list[PausedView]:
        """A pause whose tool declared no expected duration counts with its type's learned mean."""
        return [v if v.expected_duration_s is not None else dataclasses.replace(v, expected_duration_s=self.estimator.mean_s(v.aug_type))
                for v in views]

    def _views(self, state: KvState) -> list[PausedView]:
        return [PausedView(e.request_id, e.aug_type, e.context_tokens, e.paused_at_s, e.expected_duration_s,
                           math.inf if e.ttl_s is None else e.ttl_s)
                for e in self.entries.values() if e.state is state]

    def _ordered(self, state: KvState) -> list[Entry]:
        return sorted((e for e in self.entries.values() if e.state is state), key=lambda e: e.seq)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _moved(self, e: Entry, now: float | None) -> None:
        for watch in self.observers:
            watch(e, now)

    def _post(self, rec: InterceptRecord) -> None:
        self.outbox.setdefault(rec.request_id, []).append(rec)

    @staticmethod
    def _expect(e: Entry, *states: KvState) -> None:
        if e.state not in states:
            raise TransitionError(f"{e.request_id}: state {e.state.value}, expected {'/'.join(s.value for s in states)}")


class _Lazy:
    """A step view computed at most once, and only if asked for."""

    def __init__(self, fn: Callable[[], StepView]) -> None:
        self._fn, self._view = fn, None

    def get(self) -> StepView:
        if self._view is None:
            self._view = self._fn()
        return self._view
