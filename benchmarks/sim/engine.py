"""The simulated engine: a discrete-event loop around the simulated scheduler and the engine's own
intercept core, calling the core exactly where `engine_adapter/scheduler.py` does:

* before each step: `before_schedule(step_view, now)` (TTL expiry, demotion, swap planning, the
  policy's per-iteration decisions; it may cap the step's token budget);
* after the step is built: `step_copies()` (the connector ships them), then `scheduled(new, tokens)`;
* after it ran: `step_done(seconds, tokens per request, resident tokens, the copies' stall, the forward
  window)` (measured there by the workers), then outputs: a turn that
  reached its decode length pauses (`pause`; the oracle variant `tag`s it with its true duration);
* at the call's end: `expire`, `resume` (KEEP in place; RECOMPUTE / LOAD requeued by arrival time);
* under `vllm-offload`, vLLM's host KV tier around each step (`host_tier.py`): the loads the step admitted
  start with it, the blocks it completed are stored at its end, finished loads are reported with its output;
* at the end of its last turn (or an abort at the cutoff): `close`.

Time advances by each step's cost (`cost.py`); while nothing is runnable it jumps to the next event
(an arrival, a call's end) or the next TTL expiry, so idle time costs no work.
"""

from __future__ import annotations

import collections
import heapq
import math
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from infercept.benchmarks.sim.cost import StepCost, copies_s, overlapped, step_s
from infercept.benchmarks.sim.request import SimRequest
from infercept.benchmarks.sim.scheduler import SimScheduler
from engine_adapter.intercept.core import InterceptCore
from engine_adapter.intercept.reports import check_integrity, engine_stats
from engine_adapter.intercept.state import KvState, PauseInfo, ResumeKind

ARRIVAL, RESUME = 0, 1


class Stuck(RuntimeError):
    """Work is queued, nothing can run, and no event will ever change that (a simulator bug)."""


class SimEngine:
    def __init__(self, sched: SimScheduler, core_factory: Callable[[SimScheduler], InterceptCore], cost: StepCost, *,
                 oracle: bool = False, idle_step_s: float = 0.001, check_every: int = 0,
                 frontend_s: tuple[float, float] = (0.0, 0.0), host_per_request_s: float = 0.0,
                 step_overhead_s: float = 0.0, window_share: float = 1.0) -> None:
        self.sched, self.cost, self.oracle = sched, cost, oracle
        # The machine's speed relative to the one the costs describe (1.0): every step's compute and host time
        # is multiplied by it (the emulated link is not). A validation sets it per run from the bench point's
        # measured machine check, so that the replay meets the machine that point met.
        self.speed = 1.0
        self.core = core_factory(sched)
        sched.core = self.core
        self.bs = sched.bs
        self.overlap = overlapped(self.core.profile)
        self.idle_step_s = idle_step_s  # an empty engine step while work waits (vLLM's busy loop)
        self.check_every = check_every  # run the core's integrity check every N steps (tests)
        # (in, out): an input reaches the engine core this long after the front end sends it; a turn's
        # end reaches the front end this long after the step that ended it (the replay measures its
        # latency there, and sleeps the call from there).
        self.frontend_in_s, self.frontend_out_s = frontend_s
        # Host time per step per request the engine holds (running, queued or paused): vLLM's scheduler
        # walks its queues (paused sessions are skipped one by one) and the intercept core scans its
        # entries every step, in Python, on the cores that also run a CPU engine's forward pass.
        self.host_per_request_s = host_per_request_s
        # Host time per step outside what the profile measured (the engine core's scheduling, output
        # processing and IPC on this machine), whatever the step holds.
        self.step_overhead_s = step_overhead_s
        # The share of a step's time (its stall apart) that the workers' forward window covers: what
        # copies hide behind (an emulated link's copies overlap only it). The rest of a CPU step is host
        # work (input preparation, sampling, the scheduler), which the profile's T_fwd includes. The
        # engine learns it (`SwapPlanner.overlap`, the bench's `swap_overlap`); here it is given.
        self.window_share = window_share
        self.now = 0.0
        self.steps = 0
        self.idle_steps = 0  # empty steps spun while work waited behind preserved KV
        # What the copies really added to steps (the simulator knows the forward time apart), metered
        # as the core's meter does (steps with tokens; times the resident KV).
        self.true_stall_s = 0.0
        self.true_stall_token_s = 0.0
        self.finished: list[SimRequest] = []
        self._events: list[tuple[float, int, int, SimRequest]] = []
        self._seq = 0
        self._alive: dict[str, SimRequest] = {}
        self.on_finish: Callable[[SimRequest], None] | None = None

    # ================================================================== events
    def submit(self, r: SimRequest) -> None:
        r.turn_sent_s = r.arrival_s
        self._push(r.arrival_s + self.frontend_in_s, ARRIVAL, r)

    def _push(self, t: float, kind: int, r: SimRequest) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, r))

    def _deliver_due(self) -> None:
        ev = self._events
        while ev and ev[0][0] <= self.now:
            t, _, kind, r = heapq.heappop(ev)
            if kind == ARRIVAL:
                self._alive[r.rid] = r
                self.sched.add(r)
            elif r.rid in self._alive:
                self._resume(r, t)

    def run(self, until: float = math.inf) -> None:
        """Step until no work and no events are left, or the clock reaches `until`."""
        sched = self.sched
        while True:
            self._deliver_due()
            if self.now >= until:
                return
            if sched.unfinished() == 0:
                if not self._events:
                    return
                self.now = max(self.now, min(self._events[0][0], until))
                continue
            if not self._step():
                wake = self._next_wake()
                if wake is None:
                    raise Stuck(f"t={self.now:.3f}: {sched.unfinished()} requests queued, nothing can run ({self._stuck_state()})")
                self.now = max(self.now, min(wake, until))

    def _stuck_state(self) -> str:
        """What a `Stuck` report needs to be diagnosed: the queues, the free blocks, the paused entries'
        states, the waiting head."""
        sched = self.sched
        states = collections.Counter(e.state.name for e in self.core.entries.values())
        head = sched.waiting[0] if sched.waiting else None
        return (f"running {len(sched.running)}, waiting {len(sched.waiting)}, kv-ready {len(sched.kv_ready)}, "
                f"loading {len(sched.loading)}, paused slots {sched.paused_slots}/{sched.max_num_seqs}, "
                f"free blocks {sched.pool.num_free()}/{sched.pool.num_blocks}, entries {dict(states)}, head "
                + (f"{head.rid} ({head.num_computed}/{head.num_tokens} tokens, {len(head.blocks)} blocks)" if head else "none"))

    def _next_wake(self) -> float | None:
        """Nothing ran. The engine spins empty steps; what can change things is the next event, a TTL
        running out, or (while paused KV sits on the device) the policy's time-dependent decisions,
        which an empty step's worth later may free room. None: nothing ever will."""
        core = self.core
        cands = [self._events[0][0]] if self._events else []
        preserved = [e for e in core.entries.values() if e.state is KvState.PRESERVED]
        if preserved:
            cands.append(self.now + self.idle_step_s)
            self.idle_steps += 1
        if core.spec.ttl:
            cands += [e.paused_at_s + e.ttl_s for e in preserved if e.ttl_s is not None]
        tier = self.sched.host_tier
        if tier is not None and (t := tier.next_event()) is not None:
            cands.append(max(t, self.now + self.idle_step_s))  # a load or store in flight: vLLM spins until it is through
        return min(cands) if cands else None

    # ================================================================== one step
    def _step(self) -> bool:
        core, sched = self.core, self.sched
        if core.spec.new_first:
            sched.waiting_ahead(core.waiting_order)  # before demotion reads the head, as the engine
        budget = core.before_schedule(sched.step_view, self.now)
        sched.max_num_scheduled_tokens = sched.default_budget if budget is None else min(budget, sched.default_budget)
        tier = sched.host_tier
        if tier is not None:
            tier.now = self.now
            self._poll_host_tier()  # reported by the empty steps vLLM spins while a load is on the link
        out = sched.schedule()
        sched.meter_admission(core.admission, self.now, out)
        copies = core.step_copies() if core.swap is not None else None
        core.scheduled(out.new, out.load.tokens)
        fwd = self.cost.forward_s(out.load)
        fixed = self.step_overhead_s + self.host_per_request_s * len(sched.requests)  # host time of a step built
        if fwd:
            fwd = (fwd + fixed) * self.speed
        window = fwd * self.window_share  # the workers' forward window: what copies hide behind
        copy = copies_s(core.profile, len(copies.swap_out) * self.bs, len(copies.swap_in) * self.bs) if copies else 0.0
        if copies is not None and copies.loads_done:
            sched.loads_done(copies.loads_done)
        loads_started, tier_copy, stores = 0, 0.0, []
        if tier is not None:
            # The host tier's copies run in the worker when it submits them: on a CPU they add to the step.
            loads_started, tier_copy = tier.start_step()
            stores = tier.plan_stores(out.tokens)
            tier_copy += tier.store_copy_s(stores) + tier.take_stall()  # and the flushes it waits for
        if out.load.tokens == 0 and copy == 0.0 and not loads_started:
            return bool(out.preempted)
        seconds = step_s(fwd, copy, self.overlap, window) + tier_copy
        if not out.load.tokens:
            # A step that only copies: the engine still builds it and runs its workers (vLLM's
            # `kv_connector_no_forward`), so it pays the step's fixed cost besides the copy.
            seconds += fixed
        self.now += seconds
        if tier is not None:
            tier.end_step(stores, self.now)  # issued at the step's barrier
            self._poll_host_tier()  # heard with this step's output
        self.steps += 1
        if out.load.tokens:
            resident = sched.resident_tokens()
            # The stall the step really had, as the real engine's workers measure it.
            stall = seconds - fwd if self.overlap else copy
            # As the engine's workers report a step with copies: its stall and its forward window.
            core.step_done(seconds, {r.rid: n for r, n in out.tokens.items()}, resident, stall if copy else None,
                           window if copy and self.window_share < 1.0 else None)
            self.true_stall_s += stall
            self.true_stall_token_s += stall * resident
        for r, _ in out.tokens.items():
            if r.num_computed >= r.num_tokens:
                self._sampled(r)
        if self.check_every and self.steps % self.check_every == 0:
            self.check()
        return True

    def returned_by(self, t: float) -> dict[str, float]:
        """Requests whose call returned to the replay by `t` (sent its output) but whose resume has not
        reached the engine yet (the front end's delay): rid -> when the call returned."""
        return {r.rid: at - self.frontend_in_s for at, _, kind, r in self._events
                if kind == RESUME and at - self.frontend_in_s <= t}

    def _poll_host_tier(self) -> None:
        """Loads the host tier finished by now, handed to the scheduler as vLLM's finished-loading set."""
        done = self.sched.host_tier.poll(self.now)  # type: ignore[union-attr]
        if done:
            self.sched.loads_done(done)

    def _sampled(self, r: SimRequest) -> None:
        r.num_tokens += 1
        r.output_tokens += 1
        r.turn_out_tokens += 1
        if r.first_token_s is None:
            r.first_token_s = self.now + self.frontend_out_s  # where the replay sees it
        if r.turn_first_s is None:
            r.turn_first_s = self.now + self.frontend_out_s
        r.turn_left -= 1
        if r.turn_left > 0:
            return
        r.turn_log.append((r.turn, r.turn_in_tokens, r.turn_out_tokens, r.turn_sent_s, r.turn_first_s,
                           self.now + self.frontend_out_s))
        turn = r.turns[r.turn]
        if turn.call_s is None:
            self._finish(r)
            return
        # The turn reached its decode length: vLLM parks the session holding its blocks and slot,
        # then the intercept core applies the policy (the benchmark's turn-end hint gives the type).
        self.sched.park(r)
        self.core.pause(PauseInfo(r.rid, r.session_id, r.aug_type, r.expected_call_s, None, None, r.num_computed,
                                  r.arrival_time), self.now)
        if self.oracle:
            self.core.tag(r.session_id, r.aug_type, turn.call_s)
        self._push(self.now + self.frontend_out_s + turn.call_s + self.frontend_in_s, RESUME, r)

    def _resume(self, r: SimRequest, at: float) -> None:
        """The call's output reached the engine core at `at` (delivered at the next step boundary, `now`)."""
        core, sched = self.core, self.sched
        turn = r.turns[r.turn]
        r.call_s += turn.call_s or 0.0
        r.turn += 1
        r.turn_left = r.turns[r.turn].decode_tokens
        # The replay sends the tool's output when the call's sleep ends and times the turn from there
        # (`metrics.Turn`): the wait for the step under way counts in it.
        r.turn_sent_s = at - self.frontend_in_s
        r.turn_first_s = None
        r.turn_in_tokens, r.turn_out_tokens = turn.returned_tokens, 0
        core.expire(self.now)
        # vLLM's session update: the slot comes back, the context keeps its computed tokens, the
        # session puts the last sampled token back in front of the tool's output.
        if core.holds_device(r.rid) is not False:
            sched.paused_slots -= 1
        r.num_tokens = r.num_computed + 1 + turn.returned_tokens
        res = core.resume(r.rid, self.now, self.now)
        r.arrival_time = self.now if res is None else res.arrival_time
        if res is None or res.kind is ResumeKind.KEEP:
            sched.resume_in_place(r)
        elif res.kind is ResumeKind.LOAD_IN_PLACE:
            sched.wait_for_load(r)
        else:
            sched.requeue_by_arrival(r)

    def _finish(self, r: SimRequest) -> None:
        r.end_s = self.now + self.frontend_out_s
        self.core.close(r.rid, self.now)
        if self.sched.host_tier is not None:
            self.sched.host_tier.finished(r)  # before its blocks are freed
        self.sched.finish(r)
        self._alive.pop(r.rid, None)
        self.finished.append(r)
        if self.on_finish is not None:
            self.on_finish(r)

    def abort_all(self) -> list[SimRequest]:
        """The benchmark's cutoff: every request still alive is cancelled and its session closed."""
        sched, left = self.sched, list(self._alive.values())
        for r in left:
            self.core.close(r.rid, self.now)
            sched.pool.free(r.blocks)
            r.blocks = []
            sched.requests.pop(r.rid, None)
        sched.running, sched.waiting, sched.kv_ready = [], [], []
        sched._scheduled_once.clear()
        sched.loading, sched.inflight, sched.paused_slots = set(), set(), 0
        if sched.host_tier is not None:
            sched.host_tier.abort_all()
        self._events = [e for e in self._events if e[3].rid not in self._alive]
        heapq.heapify(self._events)
        self._alive.clear()
        return left

    # ================================================================== reports
    def stats(self) -> dict[str, Any]:
        """The engine's stats report, as `InterceptEngine.stats()` returns it to the benchmark."""
        counts = self.sched.block_counts()
        waiting = len(self.sched.waiting) + len(self.sched.kv_ready) + len(self.sched.loading)
        tier = self.sched.host_tier
        return asdict(engine_stats(self.core, counts, running=len(self.sched.running), waiting=waiting, now=self.now,
                                   token_budget=self.sched.default_budget,
                                   host_tier=tier.report() if tier is not None else None))

    def check(self) -> None:
        check_integrity(self.core, self.sched.block_counts())
