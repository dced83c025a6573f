"""Scheduler-side swap bookkeeping for the `swap` and `infercept` policies.

States of a paused request's KV (the scheduler's `Paused.swap`):

    None ──reserve──> "out" ──last blocks copied──> "out-done" ──next step──> "swapped"
      ^                 │  (resumed or demoted: cancel, drop host copy)          │ resumed
      └─────────────────┘                                                       v
                      waiting queue, the connector answers None (not yet armed)
                      ──armed──> vLLM allocates its blocks (WAITING_FOR_REMOTE_KVS)
                      ──chunks within each step's swap-in budget──> loaded, scheduled as usual

Per iteration the budget is the paper's swap limit N_i (tokens whose copy hides behind the forward
pass of the previous iteration's batch), split between out and in (`split_swap_budget`). A request's
swap-out may span iterations; its device blocks are freed one step after its last blocks were copied.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine_adapter.policy.profile import Profile
from engine_adapter.policy.waste import split_swap_budget, swap_limit_tokens
from engine_adapter.swap_connector import InterceptSwapConnector


@dataclass
class SwapQueues:
    out: deque[str] = field(default_factory=deque)  # request ids copying out, FIFO
    out_done: list[str] = field(default_factory=list)  # copy finished this step; free next step
    waiting_in: deque[str] = field(default_factory=deque)  # resumed, host copy not yet armed, FCFS
    armed: set[str] = field(default_factory=set)  # armed for swap-in, not yet scheduled


class SwapPlanner:
    def __init__(self, connector: InterceptSwapConnector, profile: Profile, block_size: int) -> None:
        self.conn = connector
        self.profile = profile
        self.block_size = block_size
        self.q = SwapQueues()
        self.last_batch_tokens = 1
        self.budget_history: deque[tuple[int, int, int]] = deque(maxlen=4096)  # (N, out, in) tokens
        self.moved_history: deque[tuple[int, int]] = deque(maxlen=4096)  # (out, in) tokens planned
        self._step_out_tokens = 0

    def budgets(self, want_out_tokens: int, device_free_blocks: int) -> tuple[int, int]:
        """(out, in) token budgets for this iteration."""
        n = swap_limit_tokens(self.profile, self.last_batch_tokens)
        want_in = sum(self.conn.host[r].tokens for r in self.q.waiting_in if r in self.conn.host)
        b = split_swap_budget(
            n, want_out_tokens, want_in, self.conn.slots.num_free * self.block_size,
            device_free_blocks * self.block_size,
        )
        self.budget_history.append((n, b.out_tokens, b.in_tokens))
        return b.out_tokens, b.in_tokens

    def start_out(self, request_id: str, context_tokens: int) -> int:
        """Queue a request's full blocks for copy-out; returns the tokens that will travel (0: no
        full block, or no host space)."""
        tokens = self.conn.reserve(request_id, context_tokens)
        if tokens:
            self.q.out.append(request_id)
        return tokens

    def remaining_out_tokens(self) -> int:
        return sum((len(self.conn.host[r].slots) - self.conn.host[r].copied_blocks) * self.block_size for r in self.q.out)

    def copy_out(self, block_ids_of: dict[str, list[int]], budget_tokens: int) -> list[str]:
        """Plan copy-out within the budget, oldest first; returns the requests whose copy completes
        with this step. At least one block moves per step when anything waits, so a budget smaller
        than a block still progresses."""
        budget_blocks = budget_tokens // self.block_size
        if budget_blocks == 0 and self.q.out:
            budget_blocks = 1
        done = []
        moved = 0
        while self.q.out and budget_blocks > 0:
            rid = self.q.out[0]
            blocks = block_ids_of[rid]
            n = self.conn.plan_swap_out(rid, blocks, budget_blocks)
            budget_blocks -= n
            moved += n
            if self.conn.out_complete(rid):
                self.q.out.popleft()
                done.append(rid)
        self.q.out_done.extend(done)
        self._step_out_tokens = moved * self.block_size
        return done

    def cancel(self, request_id: str) -> None:
        """Forget any swap state of a request (resumed mid copy, demoted, or closed)."""
        if request_id in self.q.out:
            self.q.out.remove(request_id)
        if request_id in self.q.out_done:
            self.q.out_done.remove(request_id)
        if request_id in self.q.waiting_in:
            self.q.waiting_in.remove(request_id)
        self.q.armed.discard(request_id)
        self.conn.drop(request_id)

    def arm_in(self, budget_tokens: int) -> list[str]:
        """Set this step's swap-in budget and keep the load pipeline fed: arm swapped requests, FCFS,
        while fewer blocks wait to be copied in than one step's budget moves. An armed request gets
        its device blocks from vLLM and is copied in chunks of at most the budget per step."""
        budget_blocks = budget_tokens // self.block_size
        self.conn.in_budget_blocks = budget_blocks
        pipeline = self.conn.loading_blocks() + sum(
            len(self.conn.host[r].slots) for r in self.q.armed if r in self.conn.host
        )
        armed = []
        while self.q.waiting_in and pipeline < max(1, budget_blocks):
            rid = self.q.waiting_in.popleft()
            self.conn.arm_swap_in(rid)
            self.q.armed.add(rid)
            armed.append(rid)
            pipeline += len(self.conn.host[rid].slots)
        return armed

    def record_step(self) -> tuple[int, int]:
        """(out, in) tokens this step's copies move; call after vLLM built the step."""
        moved = (self._step_out_tokens, self.conn.last_in_blocks * self.block_size)
        self.moved_history.append(moved)
        self._step_out_tokens = 0
        return moved

    def host_tokens_check(self, swapped_tokens_by_scheduler: int) -> None:
        """Integrity: the host buffer holds exactly what the scheduler believes is there."""
        held = self.conn.host_tokens()
        if held != swapped_tokens_by_scheduler:
            raise AssertionError(f"swap integrity: host holds {held} tokens, scheduler expects {swapped_tokens_by_scheduler}")
        used = self.conn.slots.num_slots - self.conn.slots.num_free
        expect = sum(len(hc.slots) for hc in self.conn.host.values())
        if used != expect:
            raise AssertionError(f"swap integrity: {used} host slots in use, {expect} owned")
