"""The intercept scheduler: a vLLM V1 `Scheduler` subclass loaded with `scheduler_cls`.

It runs inside vLLM's engine core (a child process). It detects intercept triggers token by token,
parks the request at the trigger as a paused streaming session, applies the intercept policy to the
paused request's KV (keep, free, free after a TTL, swap to host, give back under memory pressure),
restores the original arrival time on resume, and keeps the per-intercept ledger, the waste meter and
the block accounting. Swap planning is in `sched_swap.py`, utility-call reports in `sched_report.py`.

vLLM 0.32 internals this module and its two mixins rely on (check them on every vLLM upgrade):

* `vllm.v1.core.sched.scheduler.Scheduler`: `_update_request_with_output` (re-implemented here with
  the trigger check added; it is the base method's loop plus one call), `_handle_stopped_request`
  (parks resumable requests as `WAITING_FOR_STREAMING_REQ`), `_update_request_as_session` (keeps
  `_all_token_ids[:num_computed_tokens]` and overwrites `arrival_time`), `finish_requests`,
  `_free_request`, `_free_request_blocks`, `schedule`, and the attributes `requests`, `running`,
  `waiting`, `kv_holding_waiting` (queues), `num_waiting_for_streaming_input` (paused sessions counted
  against `max_num_active_reqs`), `max_num_active_reqs`, `max_num_scheduled_tokens`, `block_size`,
  `deferred_frees`, `kv_cache_manager`.
* `vllm.v1.core.sched.utils.check_stop`, `vllm.v1.request.{Request, RequestStatus}`.
* `kv_cache_manager.block_pool.{num_gpu_blocks, get_num_free_blocks}` and
  `kv_cache_manager.coordinator.single_type_managers[*].req_to_blocks` (block accounting).
* `vllm.v1.engine.core.EngineCore`: utility calls resolve `getattr(EngineCore, name)`; this module adds
  one method, `infercept_call`, that forwards to the scheduler (`engine.py` calls it).
* `Request.kv_hints` (`vllm.v1.kv_hints.KvHintsEnvelope`): carries the session id and the tool table.
* `SchedulerOutput.scheduled_new_reqs[*].num_computed_tokens` (prefix-cache hits or loaded tokens at a
  re-admission), `.num_scheduled_tokens`, `.total_num_scheduled_tokens`; `update_from_output`.
* Swap: `self.connector` (the KV connector vLLM built from `kv_transfer_config`), `kv_cache_config.
  kv_cache_groups`, `vllm.platforms.current_platform.device_type`, and vLLM's asynchronous KV-load
  states (`WAITING_FOR_REMOTE_KVS`, finished_recving) that `swap_connector.py` drives.
"""

from __future__ import annotations

import math
import time
from typing import Any

from vllm.logger import init_logger
from vllm.tokenizers.registry import cached_tokenizer_from_config
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.sched.utils import check_stop
from vllm.v1.engine.core import EngineCore
from vllm.v1.request import Request, RequestStatus

from engine_adapter.accounting import BlockCounts, Ledger, WasteMeter
from engine_adapter.config import CoreConfig
from engine_adapter.hints import TURN_END_KEY, parse_hints
from engine_adapter.paused import Paused
from engine_adapter.policy import Action, make_policy
from engine_adapter.policy.estimator import DurationEstimator
from engine_adapter.policy.profile import Profile
from engine_adapter.sched_report import ReportMixin
from engine_adapter.sched_swap import SwapMixin
from engine_adapter.swap_connector import kv_block_bytes
from engine_adapter.swap_plan import SwapPlanner
from engine_adapter.triggers import TriggerMatcher, find_call

logger = init_logger("vllm.infercept." + __name__)  # under vLLM's configured logger tree


class InterceptScheduler(SwapMixin, ReportMixin, Scheduler):
    """See the module docstring. Swap planning lives in `sched_swap.SwapMixin`, the utility-call
    reports in `sched_report.ReportMixin`; both work on the state set up here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ic = CoreConfig.from_additional_config(self.vllm_config.additional_config)
        self._ic_policy = make_policy(self._ic.policy, self._ic.ttl_s)
        tok = cached_tokenizer_from_config(self.vllm_config.model_config)
        vocab = [tok.decode([i]) for i in range(len(tok))]
        self._ic_matcher = TriggerMatcher(
            self._ic.triggers, tok.decode, vocab, window_tokens=self._ic.trigger_window_tokens
        )
        self._ic_trigger_names = frozenset(t.name for t in self._ic.triggers)
        self._ic_paused: dict[str, Paused] = {}
        self._ic_sessions: dict[str, str] = {}  # session id -> request id
        self._ic_recompute_pending: set[str] = set()
        self._ic_ledger = Ledger()
        self._ic_swap: SwapPlanner | None = None
        self._ic_host_expect: dict[str, int] = {}  # request id -> context tokens it keeps on the host
        self._ic_profile: Profile | None = None
        self._ic_estimator: DurationEstimator | None = None
        self._ic_last_step: tuple[float, int] | None = None
        # Context tokens each resumed request still has to recompute (counted as they are scheduled).
        self._ic_recomputing: dict[str, int] = {}
        self._ic_step_swap_tokens = (0, 0)  # (out, in) planned for the step in flight
        self._ic_waste = WasteMeter(kv_block_bytes(self.kv_cache_config) // self.block_size)
        if self._ic_policy.spec.uses_swap:
            self._ic_init_swap()
        logger.info(
            "InferCept scheduler: policy=%s triggers=%s", self._ic.policy, sorted(self._ic_trigger_names)
        )

    # ------------------------------------------------------------------ triggers
    def _update_request_with_output(
        self, request: Request, new_token_ids: list[int], is_stale: bool = False
    ) -> tuple[list[int], bool]:
        # The base loop, plus the trigger check after each token so that nothing past the trigger is
        # kept (a multi-token step is cut right after the completing token).
        stopped = False
        enabled = _enabled_triggers(request)
        for num_new, token_id in enumerate(new_token_ids, 1):
            request.append_output_token_ids(token_id)
            stopped = check_stop(request, self.max_model_len)
            if not stopped and request.resumable:
                name = self._ic_matcher.check(request.output_token_ids, enabled)
                if name is not None:
                    request.status = RequestStatus.FINISHED_STOPPED
                    request.stop_reason = name
                    stopped = True
            if stopped:
                del new_token_ids[num_new:]
                break
        return new_token_ids, stopped

    # ------------------------------------------------------------------ pause
    def _handle_stopped_request(self, request: Request) -> bool:
        trigger = request.stop_reason if request.stop_reason in self._ic_trigger_names else None
        finished = super()._handle_stopped_request(request)
        if not finished and request.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
            self._ic_pause(request, trigger)
        return finished

    def _ic_pause(self, request: Request, trigger: str | None) -> None:
        now = time.monotonic()
        hints = parse_hints(request.kv_hints)
        session_id = hints.session_id or request.request_id
        self._ic_sessions[session_id] = request.request_id
        tool = None
        if trigger is not None:
            tool = _last_tool(self._ic.triggers, trigger, request, self._ic_matcher)
            aug_type, expected = hints.tool_info(tool)
        elif TURN_END_KEY in hints.tools:
            aug_type, expected = hints.tool_info(TURN_END_KEY)
        else:
            aug_type, expected = self._ic.turn_end_type, None
        p = Paused(
            request=request,
            session_id=session_id,
            aug_type=aug_type,
            trigger=trigger,
            paused_at_s=now,
            expected_duration_s=expected,
            arrival_time=request.arrival_time,
        )
        self._ic_paused[request.request_id] = p
        action = self._ic_policy.on_pause(p.view())
        self._ic_ledger.pause(
            session_id=session_id,
            request_id=request.request_id,
            aug_type=aug_type,
            trigger=trigger,
            tool=tool,
            policy=self._ic_policy.name,
            context_tokens=request.num_computed_tokens,
            paused_at_s=now,
            expected_duration_s=expected,
            arrival_time=request.arrival_time,
            action=action.value,
        )
        if action is Action.DISCARD:
            self._ic_release(p, "discard", now)
        elif self._ic_policy.spec.swap_at_pause:
            self._ic_start_swap_out(p, now)

    def _ic_release(self, p: Paused, fate: str, now: float) -> None:
        """Free a paused request's KV and its running slot. It stays parked; its context
        (num_computed_tokens) is kept so that the resume rebuilds exactly the same tokens.
        `fate` "swap" keeps its host copy; any other fate also drops a copy in progress."""
        assert p.preserved and p.request.status == RequestStatus.WAITING_FOR_STREAMING_REQ
        if fate == "swap":
            p.swap = "swapped"
        elif p.swap is not None:
            self._ic_cancel_swap(p.request.request_id)
            p.swap = None
        self._free_request_blocks(p.request)
        p.preserved = False
        if p.holds_slot:
            self.num_waiting_for_streaming_input -= 1
            p.holds_slot = False
        self._ic_ledger.release_kv(
            p.request.request_id, fate, now, moved_tokens=self._ic_host_expect.get(p.request.request_id, 0)
        )

    # ------------------------------------------------------------------ resume
    def _update_request_as_session(self, session: Request, update: Any) -> None:
        # The engine core does not schedule while only paused requests exist, so a TTL may have run
        # out unobserved: apply it before deciding how this request comes back.
        self._ic_expire(time.monotonic())
        p = self._ic_paused.pop(session.request_id, None)
        if p is not None and not p.holds_slot:
            self.num_waiting_for_streaming_input += 1  # super() takes it off again
        super()._update_request_as_session(session, update)
        session.stop_reason = None  # vLLM carries it over between turns
        self._ic_turn_grammar(session)
        if p is None:
            return
        now = time.monotonic()
        rid = session.request_id
        if self._ic_policy.spec.keep_arrival_time:
            session.arrival_time = p.arrival_time
        self._ic_ledger.resume(rid, now, session.arrival_time)
        if self._ic_estimator is not None:
            self._ic_estimator.observe(p.aug_type, now - p.paused_at_s)
        if p.swap in ("out", "out-done"):
            # Back before its copy finished: the device blocks are still there, keep using them.
            self._ic_cancel_swap(rid)
            p.swap = None
        if p.swap == "swapped":
            # Load it back: into the waiting queue by arrival; the connector holds it back (returns
            # None) until the swap-in budget arms it, then vLLM allocates blocks and the worker loads.
            assert self._ic_swap is not None
            session.num_computed_tokens = 0
            self.kv_holding_waiting.remove_request(session)
            self._ic_enqueue_by_arrival(session)
            self._ic_swap.q.waiting_in.append(rid)
        elif not p.preserved:
            # Recompute from scratch (or from prefix-cache hits): it holds no KV now, so it belongs in
            # the plain waiting queue, ordered by arrival.
            session.num_computed_tokens = 0
            self.kv_holding_waiting.remove_request(session)
            self._ic_enqueue_by_arrival(session)
            self._ic_recompute_pending.add(session.request_id)

    def _ic_turn_grammar(self, session: Request) -> None:
        """Structured output per turn. vLLM builds a request's grammar once, at its first input; a
        streaming session's later turns only copy their sampling params, so the first turn's grammar
        (already terminated) would constrain every later turn. Rebuild it from this turn's params, or
        drop it. Compiled here, synchronously: a turn's grammar is a small regex (milliseconds)."""
        from vllm.v1.structured_output.request import StructuredOutputRequest

        sor = StructuredOutputRequest.from_sampling_params(session.sampling_params)
        session.structured_output_request = sor
        if sor is not None:
            mgr = self.structured_output_manager
            mgr.grammar_init(session)  # sets up the backend the first time; may submit async work
            sor.grammar = mgr._create_grammar(session)

    def _ic_enqueue_by_arrival(self, request: Request) -> None:
        queue = self.waiting
        if not hasattr(queue, "insert"):  # priority queue: already ordered by (priority, arrival)
            queue.add_request(request)
            return
        idx = len(queue)
        while idx > 0 and queue[idx - 1].arrival_time > request.arrival_time:
            idx -= 1
        queue.insert(idx, request)

    # ------------------------------------------------------------------ close
    def finish_requests(self, request_ids: Any, finished_status: RequestStatus) -> list[Request]:
        if request_ids is not None and not isinstance(request_ids, str):
            request_ids = list(request_ids)  # iterated twice: here and in super()
        ids = (request_ids,) if isinstance(request_ids, str) else request_ids
        for rid in list(ids) if ids is not None else list(self._ic_paused):
            p = self._ic_paused.get(rid)
            if p is not None and not p.holds_slot:
                self.num_waiting_for_streaming_input += 1  # super() takes it off again
                p.holds_slot = True
        return super().finish_requests(request_ids, finished_status)

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> Any:
        rid = request.request_id
        self._ic_paused.pop(rid, None)
        self._ic_recompute_pending.discard(rid)
        self._ic_cancel_swap(rid)
        self._ic_recomputing.pop(rid, None)
        self._ic_ledger.close(rid, time.monotonic())
        sid = parse_hints(request.kv_hints).session_id
        if sid is not None and self._ic_sessions.get(sid) == rid:
            del self._ic_sessions[sid]
        return super()._free_request(request, delay_free_blocks)

    # ------------------------------------------------------------------ per iteration
    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        now = time.monotonic()
        if self._ic_swap is not None:
            self._ic_swap_settle(now)
        self._ic_expire(now)
        self._ic_relieve_pressure(now)
        if self._ic_swap is not None:
            self._ic_swap_plan(now)
        if self._ic_policy.spec.min_waste and self._ic_profile is not None:
            # Chunked recompute (and prefill): fill each iteration up to the saturation point S and
            # no further; past S more tokens only lengthen the iteration (paper Sec. 4.3).
            self.max_num_scheduled_tokens = max(self._ic_profile.saturation_tokens, len(self.running) + 1)
        out = super().schedule(*args, **kwargs)
        if self._ic_recompute_pending or (self._ic_swap is not None and self._ic_swap.q.armed):
            armed = self._ic_swap.q.armed if self._ic_swap is not None else set()
            for new in out.scheduled_new_reqs:
                rec = None
                if new.req_id in armed:
                    armed.discard(new.req_id)
                    rec = self._ic_ledger.swapped_in(new.req_id, new.num_computed_tokens)
                elif new.req_id in self._ic_recompute_pending:
                    self._ic_recompute_pending.discard(new.req_id)
                    rec = self._ic_ledger.recomputed(new.req_id, new.num_computed_tokens)
                if rec is not None and rec.tokens_recomputed:
                    self._ic_recomputing[new.req_id] = rec.tokens_recomputed
        if self._ic_swap is not None:
            self._ic_swap.last_batch_tokens = max(1, out.total_num_scheduled_tokens)
        self._ic_last_step = (time.monotonic(), out.total_num_scheduled_tokens)
        if self._ic_swap is not None:
            self._ic_step_swap_tokens = self._ic_swap.record_step()
        return out

    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: Any) -> Any:
        if self._ic_last_step is not None:
            # schedule() returned -> the model ran -> its output is here: one iteration's real time.
            t0, tokens = self._ic_last_step
            self._ic_last_step = None
            self._ic_meter_iteration(scheduler_output, tokens, time.monotonic() - t0)
        return super().update_from_output(scheduler_output, model_runner_output)

    def _ic_meter_iteration(self, out: SchedulerOutput, tokens: int, seconds: float) -> None:
        if not tokens:
            return
        if self._ic_profile is not None:
            self._ic_profile.observe(tokens, seconds)
        recompute = 0
        for rid, n in out.num_scheduled_tokens.items():
            left = self._ic_recomputing.get(rid)
            if left:
                take = min(n, left)
                recompute += take
                if left - take > 0:
                    self._ic_recomputing[rid] = left - take
                else:
                    del self._ic_recomputing[rid]
        pool = self.kv_cache_manager.block_pool
        resident = (pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()) * self.block_size
        stall = 0.0
        if self._ic_profile is not None:
            moved_out, moved_in = self._ic_step_swap_tokens
            copy_s = self._ic_profile.t_swap_out_s(moved_out) + self._ic_profile.t_swap_in_s(moved_in)
            # CPU copies share the cores with the forward pass; on CUDA they run on a side stream
            # and only what outlasts the iteration's compute stalls it.
            stall = copy_s if self._ic_profile.device == "cpu" else max(0.0, copy_s - (seconds - copy_s))
        self._ic_step_swap_tokens = (0, 0)
        self._ic_waste.iteration(seconds, tokens, recompute, resident, stall)

    def _ic_expire(self, now: float) -> None:
        views = [p.view() for p in self._ic_paused.values()]
        for rid in self._ic_policy.expired(views, now):
            p = self._ic_paused[rid]
            # Account the span up to the expiry itself, not to when we noticed it.
            expiry = p.paused_at_s + self._ic_policy.ttl_for(p.aug_type)
            self._ic_release(p, "ttl-expired", min(now, expiry))

    def _ic_relieve_pressure(self, now: float) -> None:
        """Give back preserved KV (and running slots) when running or resumed work needs them, so a
        paused request can never starve the batch. Paused requests expected back last go first."""
        preserved = [p for p in self._ic_paused.values() if p.preserved]
        if not preserved:
            return
        need_blocks, head_waiting = self._ic_blocks_needed()
        # Brand-new requests may wait for preserved KV (that is the preserve policy's cost), unless
        # nothing runs, in which case waiting would be a deadlock.
        wants_room = head_waiting is not None and (
            head_waiting.request_id in self._ic_sessions.values() or not self.running
        )
        slots_short = wants_room and (
            len(self.running) + self.num_waiting_for_streaming_input >= self.max_num_active_reqs
        )
        free = self.kv_cache_manager.block_pool.get_num_free_blocks()
        short = need_blocks + self._ic.demotion_reserve_blocks - free
        if short <= 0 and not slots_short:
            return
        # A request already copying out is freed within a step or two anyway; demoting it would throw
        # the copy away.
        order = self._ic_policy.demotion_order([p.view() for p in preserved if p.swap is None], now)
        for rid in order:
            p = self._ic_paused[rid]
            if p.request is head_waiting:
                continue
            self._ic_release(p, "demoted", now)
            free = self.kv_cache_manager.block_pool.get_num_free_blocks()
            short = need_blocks + self._ic.demotion_reserve_blocks - free
            slots_short = slots_short and (
                len(self.running) + self.num_waiting_for_streaming_input >= self.max_num_active_reqs
            )
            if short <= 0 and not slots_short:
                break

    def _ic_blocks_needed(self) -> tuple[int, Request | None]:
        """Blocks the next step needs: running requests first, then the first waiting request that
        is ready (vLLM's own order), within the step's token budget."""
        budget = self.max_num_scheduled_tokens
        need = 0
        for req in self.running:
            n = min(max(req.num_tokens_with_spec - req.num_computed_tokens, 0), budget)
            budget -= n
            need += self._ic_new_blocks(req, n)
        head: Request | None = None
        for queue in (self.kv_holding_waiting, self.waiting):
            for req in queue:
                if req.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                    head = req
                    break
            if head is not None:
                break
        if head is not None and budget > 0:
            n = min(head.num_tokens - head.num_computed_tokens, budget)
            need += self._ic_new_blocks(head, n)
        return need, head

    def _ic_new_blocks(self, req: Request, n_tokens: int) -> int:
        held = len(self._ic_req_blocks(req.request_id))
        return max(0, math.ceil((req.num_computed_tokens + n_tokens) / self.block_size) - held)

    def _ic_req_blocks(self, request_id: str) -> list[int]:
        ids: list[int] = []
        for mgr in self.kv_cache_manager.coordinator.single_type_managers:
            ids.extend(b.block_id for b in mgr.req_to_blocks.get(request_id, ()) if not b.is_null)
        return ids


def _enabled_triggers(request: Request) -> frozenset[str] | None:
    sp = request.sampling_params
    extra = (sp.extra_args or {}).get("infercept") if sp is not None else None
    if not extra or extra.get("triggers") is None:
        return None
    return frozenset(extra["triggers"])


def _last_tool(triggers: Any, trigger: str, request: Request, matcher: TriggerMatcher) -> str | None:
    window = list(request.output_token_ids[-matcher.window_tokens :])
    match = find_call(triggers, trigger, matcher.decode(window))
    return match.tool if match is not None else None


def _infercept_call(self: EngineCore, method: str, args: list[Any]) -> Any:
    """Utility entry point (`AsyncLLM.engine_core.call_utility_async("infercept_call", ...)`)."""
    sched = self.scheduler
    if not isinstance(sched, InterceptScheduler):
        raise RuntimeError("the engine core is not running the InferCept scheduler")
    fn = getattr(sched, "infercept_" + method, None)
    if fn is None:
        raise ValueError(f"unknown infercept call {method!r}")
    result = fn(*args)
    return result.to_dict() if isinstance(result, BlockCounts) else result


EngineCore.infercept_call = _infercept_call  # type: ignore[attr-defined]
