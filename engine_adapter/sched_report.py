"""What the engine core reports through utility calls (`InterceptEngine.stats`, `intercepts`,
`check_integrity`, `tag`), as a mixin of `InterceptScheduler`: reads of the scheduler's state, plus the
one write `tag` (a caller refining a pause's type or expected duration)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from engine_adapter.accounting import BlockCounts, Ledger, WasteMeter

if TYPE_CHECKING:
    from engine_adapter.paused import Paused
    from engine_adapter.swap_plan import SwapPlanner


class ReportMixin:
    _ic_paused: dict[str, Paused]
    _ic_ledger: Ledger
    _ic_waste: WasteMeter
    _ic_swap: SwapPlanner | None
    _ic_host_expect: dict[str, int]
    _ic_sessions: dict[str, str]

    def infercept_block_counts(self) -> BlockCounts:
        pool = self.kv_cache_manager.block_pool
        paused: set[int] = set()
        others: set[int] = set()
        for rid in self.requests:
            p = self._ic_paused.get(rid)
            (paused if p is not None else others).update(self._ic_req_blocks(rid))
        in_flight = sum(len(blocks) for _, blocks in self.deferred_frees)
        return BlockCounts(
            total=pool.num_gpu_blocks - 1,  # block 0 is vLLM's null block
            free=pool.get_num_free_blocks(),
            running=len(others) + in_flight,
            preserved=len(paused - others),
        )

    def infercept_stats(self) -> dict[str, Any]:
        now = time.monotonic()
        counts = self.infercept_block_counts()
        return {
            "policy": self._ic_policy.name,
            "block_size": self.block_size,
            # Device blocks by state, plus the blocks' worth of KV now in the host buffer.
            "blocks": counts.to_dict() | {"swapped_to_host": sum(
                len(hc.slots) for hc in self._ic_swap.conn.host.values()) if self._ic_swap else 0},
            "totals": self._ic_ledger.snapshot(now),
            "paused": len(self._ic_paused),
            "paused_preserved": sum(p.preserved for p in self._ic_paused.values()),
            "running": len(self.running),
            "waiting": len(self.waiting) + len(self.kv_holding_waiting) - len(self._ic_paused),
            "engine_time_s": now,
            "swap": self._ic_swap_stats(),
            "waste": self._ic_waste.snapshot(self._ic_ledger.snapshot(now)["preserved_token_seconds"]),
        }

    def infercept_intercepts(self, session_id: str | None = None) -> list[dict[str, Any]]:
        return [
            r.to_dict()
            for r in self._ic_ledger.records
            if session_id is None or r.session_id == session_id
        ]

    def infercept_check_integrity(self) -> dict[str, int]:
        counts = self.infercept_block_counts()
        counts.check()
        out = counts.to_dict()
        if self._ic_swap is not None:
            expect = sum(self._ic_host_expect.values())
            self._ic_swap.host_tokens_check(expect)
            out["host_tokens"] = expect
        return out

    def infercept_tag(self, session_id: str, aug_type: str, expected_duration_s: float | None) -> bool:
        """Refine the type / expected duration of a session's current pause (the caller may know more
        than the tool table, e.g. an oracle duration)."""
        rid = self._ic_sessions.get(session_id)
        p = self._ic_paused.get(rid) if rid is not None else None
        if p is None:
            return False
        p.aug_type = aug_type
        p.expected_duration_s = expected_duration_s
        rec = self._ic_ledger.open.get(rid)
        if rec is not None:
            rec.aug_type, rec.expected_duration_s = aug_type, expected_duration_s
        return True
