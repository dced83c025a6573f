"""The intercept scheduler: a vLLM V1 `Scheduler` subclass loaded with `scheduler_cls`, running inside
vLLM's engine core (a child process). Thin hook overrides: each translates vLLM's request states into
one call on the intercept core (`intercept/core.py`) and applies the result.

vLLM 0.32 internals relied on here (the rest are in `vllm_port.py` and `swap_connector.py`):
* `Scheduler._update_request_with_output` (re-implemented: the base loop plus the trigger check),
  `_handle_stopped_request` (parks resumable requests as `WAITING_FOR_STREAMING_REQ`),
  `_update_request_as_session` (keeps `_all_token_ids[:num_computed_tokens]`, overwrites
  `arrival_time`, gives the running slot back), `finish_requests`, `_free_request`, `schedule`,
  `update_from_output`, `structured_output_manager` (its `grammar_init`; the private compile is the
  port's `compile_grammar`);
* `vllm.v1.core.sched.utils.check_stop`, `vllm.v1.request.{Request, RequestStatus}`;
* `SchedulerOutput.{scheduled_new_reqs[*].num_computed_tokens, num_scheduled_tokens,
  total_num_scheduled_tokens}`; `EngineCoreOutput.kv_transfer_params` (carries intercept records to
  the front end: it is passed through to `RequestOutput.kv_transfer_params` for every output);
* `Scheduler.waiting` (counted to tell new requests waiting), `SchedulerOutput.scheduled_new_reqs[*].req_id`;
* `Request.kv_hints` (`vllm.v1.kv_hints.KvHintsEnvelope`): the session id and the tool table;
* `vllm.v1.engine.core.EngineCore`: utility calls resolve `getattr(EngineCore, name)`; this module
  adds `infercept_call`, which forwards to the scheduler's report methods.
"""

from __future__ import annotations

import time
from typing import Any

from vllm.logger import init_logger
from vllm.tokenizers.registry import cached_tokenizer_from_config
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.core.sched.utils import check_stop
from vllm.v1.engine.core import EngineCore
from vllm.v1.request import Request, RequestStatus

from engine_adapter.config import CoreConfig
from engine_adapter.hints import TURN_END_KEY, parse_hints
from engine_adapter.intercept.build import build_core
from engine_adapter.intercept.records import RECORDS_KEY
from engine_adapter.intercept.reports import STEP_PARTS, check_integrity, engine_stats, to_dict
from engine_adapter.intercept.state import PauseInfo, ResumeKind
from engine_adapter.offload_connector import InterceptOffloadingConnector
from engine_adapter.swap_connector import InterceptSwapConnector, kv_block_bytes, measured_stall_and_window
from engine_adapter.triggers import TriggerMatcher, find_call
from engine_adapter.vllm_port import VllmPort, compile_grammar

logger = init_logger("vllm.infercept." + __name__)  # under vLLM's configured logger tree


class InterceptScheduler(Scheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = CoreConfig.from_additional_config(self.vllm_config.additional_config)
        from vllm.platforms import current_platform

        self.ic_port = VllmPort(self)
        conn = self.connector if isinstance(self.connector, InterceptSwapConnector) else None
        self.ic = build_core(cfg, self.ic_port, model=self.vllm_config.model_config.model,
                             device=str(current_platform.device_type), block_size=self.block_size,
                             kv_bytes_per_token=kv_block_bytes(self.kv_cache_config) // self.block_size,
                             host_slots=conn.host_slots if conn is not None else 0,
                             # vLLM zeroes newly allocated blocks (Mamba, mixed-precision caches) before the
                             # forward, so before a copy of a block released in that step could read it.
                             release_when_copied=not self.kv_cache_config.needs_kv_cache_zeroing)
        if self.ic.spec.swap:
            if conn is None:
                raise RuntimeError(f"policy {cfg.policy!r} needs the InterceptSwapConnector as KV connector")
            if len(self.kv_cache_config.kv_cache_groups) != 1:
                raise RuntimeError("swap supports models with one KV cache group (plain attention)")
            conn.bind_core(self.ic)
        tok = cached_tokenizer_from_config(self.vllm_config.model_config)
        self.ic_triggers = cfg.triggers
        self.ic_matcher = TriggerMatcher(cfg.triggers, tok.decode, [tok.decode([i]) for i in range(len(tok))],
                                         window_tokens=cfg.trigger_window_tokens)
        self.ic_turn_end_type = cfg.turn_end_type
        self._ic_step_started: float | None = None
        self.ic.step_parts_s = dict.fromkeys(STEP_PARTS, 0.0)
        self._ic_output_handled: float | None = None  # when the last step with tokens handled its output
        self._ic_engine_budget = self.max_num_scheduled_tokens  # max_num_batched_tokens: a policy's cap stays within it
        self._ic_scheduled_once: set[str] = set()  # live requests scheduled at least once (the rest are new)
        logger.info("InferCept scheduler: policy=%s triggers=%s", cfg.policy, [t.name for t in cfg.triggers])

    # ------------------------------------------------------------------ triggers
    def _update_request_with_output(self, request: Request, new_token_ids: list[int],
                                    is_stale: bool = False) -> tuple[list[int], bool]:
        # The base loop, plus the trigger check after each token so that nothing past the trigger is
        # kept (a multi-token step is cut right after the completing token).
        stopped = False
        enabled = _enabled_triggers(request)
        for num_new, token_id in enumerate(new_token_ids, 1):
            request.append_output_token_ids(token_id)
            stopped = check_stop(request, self.max_model_len)
            if not stopped and request.resumable:
                name = self.ic_matcher.check(request.output_token_ids, enabled)
                if name is not None:
                    request.status = RequestStatus.FINISHED_STOPPED
                    request.stop_reason = name
                    stopped = True
            if stopped:
                del new_token_ids[num_new:]
                break
        return new_token_ids, stopped

    # ------------------------------------------------------------------ pause, resume, close
    def _handle_stopped_request(self, request: Request) -> bool:
        trigger = request.stop_reason if any(t.name == request.stop_reason for t in self.ic_triggers) else None
        finished = super()._handle_stopped_request(request)
        if not finished and request.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
            self.ic.pause(self._pause_info(request, trigger), time.monotonic())
        return finished

    def _pause_info(self, request: Request, trigger: str | None) -> PauseInfo:
        hints = parse_hints(request.kv_hints)
        tool = None
        if trigger is not None:
            window = list(request.output_token_ids[-self.ic_matcher.window_tokens:])
            match = find_call(self.ic_triggers, trigger, self.ic_matcher.decode(window))
            tool = match.tool if match is not None else None
            aug_type, expected = hints.tool_info(tool)
        elif TURN_END_KEY in hints.tools:
            aug_type, expected = hints.tool_info(TURN_END_KEY)
        else:
            aug_type, expected = self.ic_turn_end_type, None
        return PauseInfo(request.request_id, hints.session_id or request.request_id, aug_type, expected, tool,
                         trigger, request.num_computed_tokens, request.arrival_time)

    def _update_request_as_session(self, session: Request, update: Any) -> None:
        now = time.monotonic()
        self.ic.expire(now)  # a TTL may have run out while the engine had nothing to step
        if self.ic.holds_device(session.request_id) is False:
            self.ic_port.take_slot_back()  # super() gives the paused request's slot back once more
        super()._update_request_as_session(session, update)
        session.stop_reason = None  # vLLM carries it over between turns
        self._turn_grammar(session)
        resume = self.ic.resume(session.request_id, now, session.arrival_time)
        if resume is None:
            return
        session.arrival_time = resume.arrival_time
        if resume.kind is ResumeKind.LOAD_IN_PLACE:
            # A prefetch still copying into the blocks it holds: it waits where it is, in the KV-holding
            # queue, as an asynchronous KV load does, until the connector reports the copy done.
            self.ic_port.wait_for_load(session)
        elif resume.kind is not ResumeKind.KEEP:
            # No KV on the device: rebuilt from scratch, from prefix-cache hits, or loaded from the
            # host (the connector holds it back until the swap-in budget arms it).
            session.num_computed_tokens = 0
            self.ic_port.requeue_by_arrival(session)

    def _turn_grammar(self, session: Request) -> None:
        """Structured output per turn. vLLM builds a request's grammar once, at its first input; a
        streaming session's later turns only copy their sampling params, so the first turn's grammar
        (already terminated) would constrain every later turn. Rebuild it from this turn's params, or
        drop it (a turn's grammar is a small regex: compiled here in milliseconds)."""
        from vllm.v1.structured_output.request import StructuredOutputRequest

        sor = StructuredOutputRequest.from_sampling_params(session.sampling_params)
        session.structured_output_request = sor
        if sor is not None:
            mgr = self.structured_output_manager
            mgr.grammar_init(session)  # sets up the backend the first time; may submit async work
            sor.grammar = compile_grammar(mgr, session)

    def finish_requests(self, request_ids: Any, finished_status: RequestStatus) -> list[Request]:
        if request_ids is not None and not isinstance(request_ids, str):
            request_ids = list(request_ids)  # iterated twice: here and in super()
        ids = (request_ids,) if isinstance(request_ids, str) else request_ids
        for rid in list(ids) if ids is not None else list(self.requests):
            if self.ic.holds_device(rid) is False:
                self.ic_port.take_slot_back()  # super() gives a paused request's slot back once more
        return super().finish_requests(request_ids, finished_status)

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> Any:
        self.ic.close(request.request_id, time.monotonic())
        self._ic_scheduled_once.discard(request.request_id)
        return super()._free_request(request, delay_free_blocks)

    def get_num_unfinished_requests(self) -> int:
        # A paused request whose KV (and running slot) went (discarded, swapped) still sits in the
        # KV-holding queue, where vLLM counts it as work unless it holds a slot: without this, the
        # engine core would spin through empty steps for as long as such a request stays paused.
        return max(0, super().get_num_unfinished_requests() - len(self.ic.paused_ids(on_device=False)))

    # ------------------------------------------------------------------ per iteration
    def schedule(self, *args: Any, **kwargs: Any) -> SchedulerOutput:
        t0 = time.perf_counter()
        gap = t0 - self._ic_output_handled if self._ic_output_handled is not None else None
        if self.ic.spec.new_first:
            self.ic_port.waiting_ahead(self.ic.waiting_order)  # before demotion reads the head
        budget = self.ic.before_schedule(self.ic_port.step_view, time.monotonic())
        if budget is not None:
            self.max_num_scheduled_tokens = min(budget, self._ic_engine_budget)
        t1 = time.perf_counter()
        out = super().schedule(*args, **kwargs)
        t2 = time.perf_counter()
        self._ic_meter_admission(out)
        # A resumed request's first schedule: a new request, or (when vLLM preempted it at some point
        # before, `num_preemptions`) a resumed one among the cached requests.
        cached = out.scheduled_cached_reqs
        first = [(r.req_id, r.num_computed_tokens) for r in out.scheduled_new_reqs]
        first += [(rid, n) for rid, n in zip(cached.req_ids, cached.num_computed_tokens) if rid in cached.resumed_req_ids]
        self.ic.scheduled(first, out.total_num_scheduled_tokens)
        self._ic_step_started = time.monotonic() if out.total_num_scheduled_tokens else None
        parts = self.ic.step_parts_s
        assert parts is not None
        t3 = time.perf_counter()
        if out.total_num_scheduled_tokens:
            parts["ours"] += (t1 - t0) + (t3 - t2)
            parts["vllm_schedule"] += t2 - t1
            if gap is not None:
                parts["between"] += gap  # busy from the last step with tokens to this one: no idle wait in it
        else:
            parts["empty"] += t3 - t0
            self._ic_output_handled = None
        return out

    def _ic_meter_admission(self, out: SchedulerOutput) -> None:
        """Why the new requests this step leaves waiting wait (the reasons of `meter.WAIT_REASONS`, in the
        order vLLM's waiting scan stops): what sets their time to first token, besides their prefill."""
        def stop() -> str | None:
            head = self.ic_port.scan_stop(self.ic.holds_back)
            return head.request_id if head is not None else None

        self.ic.admission.schedule(time.monotonic(), (r.req_id for r in out.scheduled_new_reqs),
                                   (r.request_id for r in self.waiting), self._ic_scheduled_once,
                                   slots_full=self.ic_port.slots_full(),
                                   budget_full=out.total_num_scheduled_tokens >= self.max_num_scheduled_tokens, stop=stop)

    def update_from_output(self, scheduler_output: SchedulerOutput, model_runner_output: Any) -> Any:
        t0 = time.perf_counter()
        if self._ic_step_started is not None:
            # schedule() returned -> the model ran -> its output is here: one iteration's real time.
            seconds, self._ic_step_started = time.monotonic() - self._ic_step_started, None
            stall_s, window_s = measured_stall_and_window(model_runner_output)
            self.ic.step_done(seconds, scheduler_output.num_scheduled_tokens, self.ic_port.resident_tokens(),
                              stall_s, window_s)
        t1 = time.perf_counter()
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        t2 = time.perf_counter()
        if self.ic.outbox:
            # The front end learns what became of a pause with the request's next output.
            for eco in outputs.values():
                for o in eco.outputs:
                    recs = self.ic.outbox.pop(o.request_id, None)
                    if recs:
                        o.kv_transfer_params = {**(o.kv_transfer_params or {}), RECORDS_KEY: [r.to_dict() for r in recs]}
        parts = self.ic.step_parts_s
        assert parts is not None
        t3 = time.perf_counter()
        if scheduler_output.total_num_scheduled_tokens:
            parts["ours"] += (t1 - t0) + (t3 - t2)
            parts["vllm_update"] += t2 - t1
            # The gap to the next step is busy only while vLLM has requests: without, its loop blocks on
            # its input queue (a paused request whose KV went is not one: `get_num_unfinished_requests`).
            self._ic_output_handled = t3 if self.has_requests() else None
        else:
            parts["empty"] += t3 - t0
        return outputs

    # ------------------------------------------------------------------ reports (utility calls)
    def infercept_stats(self) -> dict[str, Any]:
        counts = self.ic_port.block_counts(self.ic.paused_ids(on_device=True))
        waiting = len(self.waiting) + len(self.kv_holding_waiting)
        tier = self.connector.host_tier_report() if isinstance(self.connector, InterceptOffloadingConnector) else None
        return to_dict(engine_stats(self.ic, counts, running=len(self.running), waiting=waiting, now=time.monotonic(),
                                    token_budget=self._ic_engine_budget, host_tier=tier))

    def infercept_intercepts(self, session_id: str | None = None) -> list[dict[str, Any]]:
        return [r.to_dict() for r in self.ic.ledger.of_session(session_id)]

    def infercept_check_integrity(self) -> dict[str, int]:
        return to_dict(check_integrity(self.ic, self.ic_port.block_counts(self.ic.paused_ids(on_device=True))))

    def infercept_tag(self, session_id: str, aug_type: str, expected_duration_s: float | None) -> bool:
        return self.ic.tag(session_id, aug_type, expected_duration_s)


def _enabled_triggers(request: Request) -> frozenset[str] | None:
    sp = request.sampling_params
    extra = (sp.extra_args or {}).get("infercept") if sp is not None else None
    if not extra or extra.get("triggers") is None:
        return None
    return frozenset(extra["triggers"])


def _infercept_call(self: EngineCore, method: str, args: list[Any]) -> Any:
    """Utility entry point (`AsyncLLM.engine_core.call_utility_async("infercept_call", ...)`)."""
    sched = self.scheduler
    if not isinstance(sched, InterceptScheduler):
        raise RuntimeError("the engine core is not running the InferCept scheduler")
    fn = getattr(sched, "infercept_" + method, None)
    if fn is None:
        raise ValueError(f"unknown infercept call {method!r}")
    return fn(*args)


EngineCore.infercept_call = _infercept_call  # type: ignore[attr-defined]
