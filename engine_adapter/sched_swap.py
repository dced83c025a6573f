"""Swap scheduling for the `swap` and `infercept` policies, as a mixin of `InterceptScheduler`: set-up
(profile, estimator, planner), starting and cancelling copies, settling what the previous step copied,
and the per-iteration plan (budgets, the paper's min-waste choice). It works on the scheduler's own
state (`_ic_paused`, `_ic_swap`, `_ic_host_expect`, ...), initialised in `InterceptScheduler.__init__`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vllm.logger import init_logger

from engine_adapter.policy.decide import PausedCost, infercept_plan
from engine_adapter.policy.estimator import DurationEstimator, load_priors
from engine_adapter.policy.profile import Profile, default_profile, profile_path
from engine_adapter.policy.waste import (
    recompute_chunk_tokens,
    waste_chunked_discard_byte_s,
    waste_preserve_byte_s,
)
from engine_adapter.swap_connector import InterceptSwapConnector
from engine_adapter.swap_plan import SwapPlanner

if TYPE_CHECKING:
    from engine_adapter.paused import Paused

REPO_CONFIGS = Path(__file__).resolve().parent.parent / "configs"

logger = init_logger("vllm.infercept." + __name__)  # under vLLM's configured logger tree


class SwapMixin:
    _ic: Any
    _ic_paused: dict[str, Paused]
    _ic_swap: SwapPlanner | None
    _ic_profile: Profile | None
    _ic_estimator: DurationEstimator | None
    _ic_host_expect: dict[str, int]

    def _ic_init_swap(self) -> None:
        conn = self.connector
        if not isinstance(conn, InterceptSwapConnector):
            raise RuntimeError(f"policy {self._ic.policy!r} needs the InterceptSwapConnector as KV connector")
        if len(self.kv_cache_config.kv_cache_groups) != 1:
            raise RuntimeError("swap supports models with one KV cache group (plain attention)")
        from vllm.platforms import current_platform

        device = str(current_platform.device_type)
        model = self.vllm_config.model_config.model
        path = Path(self._ic.profile) if self._ic.profile else profile_path(REPO_CONFIGS / "profiles", model, device)
        if path.is_file():
            prof = Profile.load(path)
            prof = dataclasses.replace(prof, kv_bytes_per_token=conn.kv_bytes_per_token)
        else:
            prof = default_profile(model, device, conn.kv_bytes_per_token, f"no profile at {path}")
        if self._ic.swap_link_gbps:
            # Swaps go over an emulated link: budgets and stall accounting use its bandwidth, and
            # copies overlap the forward pass as on a GPU's side stream.
            link = self._ic.swap_link_gbps * 1e9
            prof = dataclasses.replace(prof, swap_out_bytes_per_s=link, swap_in_bytes_per_s=link,
                                       device=f"{prof.device}+link", source=f"{prof.source}; emulated link {self._ic.swap_link_gbps} GB/s")
        logger.info("InferCept profile: %s (S=%d tokens, M=%d B/token)", prof.source, prof.saturation_tokens, prof.kv_bytes_per_token)
        self._ic_profile = prof
        self._ic_swap = SwapPlanner(conn, prof, self.block_size)
        priors_path = self._ic.augmentation_priors or str(REPO_CONFIGS / "augmentations.yaml")
        priors = load_priors(priors_path) if Path(priors_path).is_file() else {}
        self._ic_estimator = DurationEstimator(self._ic.estimator, priors)

    def _ic_start_swap_out(self, p: Paused, now: float) -> bool:
        assert self._ic_swap is not None
        rid = p.request.request_id
        tokens = self._ic_swap.start_out(rid, p.request.num_computed_tokens)
        if not tokens:
            # The swap space is full (or the context is under one block): fall back to discard.
            self._ic_release(p, "discard", now)
            return False
        p.swap = "out"
        self._ic_host_expect[rid] = tokens
        return True

    def _ic_cancel_swap(self, rid: str) -> None:
        if self._ic_swap is not None:
            self._ic_swap.cancel(rid)
        self._ic_host_expect.pop(rid, None)

    def _ic_swap_settle(self, now: float) -> None:
        """What the previous step's copies completed: free the device blocks of finished swap-outs,
        release the host slots of finished swap-ins."""
        sw = self._ic_swap
        assert sw is not None
        for rid in sw.q.out_done:
            p = self._ic_paused[rid]
            self._ic_release(p, "swap", now)
        sw.q.out_done.clear()
        for rid in sw.conn.restored():
            self._ic_host_expect.pop(rid, None)

    def _ic_swap_plan(self, now: float) -> None:
        sw = self._ic_swap
        assert sw is not None
        pool = self.kv_cache_manager.block_pool
        inflight_tokens = sw.remaining_out_tokens()
        candidates = [p for p in self._ic_paused.values() if p.preserved and p.swap is None]
        want_out = inflight_tokens + (
            sum(p.request.num_computed_tokens for p in candidates) if self._ic_policy.spec.min_waste else 0
        )
        out_budget, in_budget = sw.budgets(want_out, pool.get_num_free_blocks())
        if self._ic_policy.spec.min_waste and candidates:
            self._ic_min_waste(candidates, max(0, out_budget - inflight_tokens), now)
        done = sw.copy_out({r: self._ic_group0_blocks(r) for r in sw.q.out}, out_budget)
        for rid in done:
            self._ic_paused[rid].swap = "out-done"
        sw.arm_in(in_budget)

    def _ic_min_waste(self, candidates: list[Paused], out_budget_tokens: int, now: float) -> None:
        """The paper's per-iteration choice (Eq. 2, 4, 5) over the paused requests still on device."""
        prof, est, sw = self._ic_profile, self._ic_estimator, self._ic_swap
        assert prof is not None and est is not None and sw is not None
        running_tokens = sum(r.num_computed_tokens for r in self.running)
        batch = max(1, sw.last_batch_tokens)
        chunk = recompute_chunk_tokens(prof, len(self.running))
        costs = []
        for p in candidates:
            ctx = p.request.num_computed_tokens
            remaining = est.remaining_s(p.aug_type, now - p.paused_at_s, p.expected_duration_s)
            round_trip = prof.t_swap_out_s(ctx) + prof.t_swap_in_s(ctx)
            costs.append(
                PausedCost(
                    request_id=p.request.request_id,
                    context_blocks=ctx // self.block_size,  # only full blocks travel
                    waste_preserve=waste_preserve_byte_s(remaining, ctx, prof.kv_bytes_per_token),
                    waste_discard=waste_chunked_discard_byte_s(prof, ctx, running_tokens, chunk),
                    swap_worthwhile=remaining > round_trip + prof.t_fwd_s(batch),
                )
            )
        plan = infercept_plan(costs, out_budget_tokens // self.block_size, sw.conn.slots.num_free)
        for rid in plan.swap_out:
            p = self._ic_paused[rid]
            self._ic_start_swap_out(p, now)
        for rid in plan.discard:
            self._ic_release(self._ic_paused[rid], "discard", now)

    def _ic_group0_blocks(self, request_id: str) -> list[int]:
        mgr = self.kv_cache_manager.coordinator.single_type_managers[0]
        return [b.block_id for b in mgr.req_to_blocks.get(request_id, ())]

    def _ic_swap_stats(self) -> dict[str, Any] | None:
        sw = self._ic_swap
        if sw is None:
            return None
        hist = list(sw.budget_history)
        return {
            **sw.conn.stats,
            "host_slots": sw.conn.slots.num_slots,
            "host_slots_free": sw.conn.slots.num_free,
            "host_tokens": sw.conn.host_tokens(),
            "loading_blocks": sw.conn.loading_blocks(),
            "profile": self._ic_profile.source if self._ic_profile else None,
            "saturation_tokens": self._ic_profile.saturation_tokens if self._ic_profile else None,
            "t_fwd_refinement": dict(self._ic_profile._ratios) if self._ic_profile else None,
            "kv_bytes_per_token": sw.conn.kv_bytes_per_token,
            "recent_budgets": [{"limit": n, "out": o, "in": i} for n, o, i in hist[-256:]],
            "moved": [{"out": o, "in": i} for o, i in list(sw.moved_history)[-256:]],
        }
