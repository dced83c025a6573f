"""Swap bookkeeping of the intercept core: host slots, per-iteration budgets, and the copy lists the
KV connector ships to the workers. Pure (no vLLM, no torch).

A host slot holds one KV block (all layers). Every block of a context travels, its partial last block
too (copied whole: the slots past the context are overwritten by the resume's first forward pass, which
runs only after the load has finished), so a swapped context comes back with nothing to recompute.

Per iteration the budget is the paper's swap limit N_i (the tokens whose copy hides behind the forward
pass of the previous iteration's batch), split between swap-out and swap-in (Sec. 4.2).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from engine_adapter.policy.profile import Profile
from engine_adapter.policy.waste import (
    SwapBudget,
    split_swap_budget,
    swap_limit_tokens,
    swapped_blocks,
)


class SlotPool:
    """Host buffer slots."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int] | None:
        """n slots, or None when fewer are free."""
        if n > len(self._free):
            return None
        return [self._free.pop() for _ in range(n)]

    def give(self, slots: list[int]) -> None:
        self._free.extend(reversed(slots))
        if len(self._free) > self.num_slots:
            raise AssertionError("host slot freed twice")


@dataclass
class HostCopy:
    """A paused request's KV in the host buffer, or on its way there or back."""

    slots: list[int]  # host slot of the request's i-th block
    tokens: int  # context tokens covered (all of them; the last block may be partly filled)
    copied_out: int = 0  # blocks planned for copy-out so far
    to_load: deque[tuple[int, int]] | None = None  # (device block, slot) pairs still to copy in
    hit_tokens: int = 0  # of `tokens`, those vLLM's prefix cache held at the load (not copied in)

    @property
    def out_complete(self) -> bool:
        return self.copied_out == len(self.slots)

    @property
    def blocks_to_load(self) -> int:
        """Blocks still to copy in: all of them until the load is armed with device blocks."""
        return len(self.to_load) if self.to_load is not None else len(self.slots)


@dataclass(frozen=True)
class StepCopies:
    """One step's copies for the workers: (device block, host slot) pairs."""

    swap_out: list[tuple[int, int]]
    swap_in: list[tuple[int, int]]
    loads_done: list[str]  # requests whose last blocks come in with this step (or were abandoned)
    # Copies out of blocks released in this step and already reallocated by the engine: the workers
    # read them before the forward pass writes them.
    swap_out_first: list[tuple[int, int]] = field(default_factory=list)


@dataclass(frozen=True)
class StepSwap:
    """What one iteration was allowed and what it moved (tokens)."""

    limit: int
    out_budget: int
    in_budget: int
    out_moved: int = 0
    in_moved: int = 0


@dataclass
class SwapStats:
    tokens_out: int = 0
    tokens_in: int = 0
    blocks_out: int = 0
    blocks_in: int = 0
    blocks_out_first: int = 0  # copied before the forward pass: released and reused in their copy's step


class SwapPlanner:
    """Host slots and budgets. The intercept core decides who moves; this plans how much per step."""

    def __init__(self, profile: Profile, block_size: int, host_slots: int) -> None:
        self.profile = profile
        self.block_size = block_size
        self.slots = SlotPool(host_slots)
        self.last_batch_tokens = 1  # B_i of the previous iteration
        # The share of a step's time that copies can hide behind: the workers' forward window (from the
        # step's copies being handed over to its barrier) over the step's time as the scheduler sees it,
        # which also holds host work (input preparation, sampling, output processing) no copy overlaps.
        # Learned where the workers measure it; 1.0 (the whole step) otherwise.
        self.overlap = 1.0
        self.in_budget_blocks = 0
        self.prefetch_blocks = 0  # this step's link capacity for prefetches (`spare_blocks`, when one is under way)
        self.stats = SwapStats()
        self.history: deque[StepSwap] = deque(maxlen=4096)
        self._out: list[tuple[int, int]] = []
        self._step: StepSwap | None = None

    # ------------------------------------------------------------------ host slots
    def blocks(self, context_tokens: int) -> int:
        """Host slots a context of this many tokens takes (`swapped_blocks`)."""
        return swapped_blocks(context_tokens, self.block_size)

    def fits(self, context_tokens: int) -> bool:
        """`reserve` would succeed: the context has KV and the buffer room for all of its blocks."""
        return 0 < self.blocks(context_tokens) <= self.slots.num_free

    def reserve(self, context_tokens: int) -> HostCopy | None:
        """Host slots for all of a context's blocks; None when it has none or the buffer is full."""
        if not self.fits(context_tokens):
            return None
        slots = self.slots.take(self.blocks(context_tokens))
        assert slots is not None
        return HostCopy(slots=slots, tokens=context_tokens)

    def release(self, host: HostCopy) -> None:
        self.slots.give(host.slots)
        host.slots = []

    # ------------------------------------------------------------------ per step
    def budgets(self, want_out_tokens: int, want_in_tokens: int, device_free_blocks: int,
                reserved_out_tokens: int = 0, batch_tokens: int | None = None) -> SwapBudget:
        """This iteration's (out, in) token budgets. `device_free_blocks`: the room swap-ins may fill (free
        blocks, and those loads under way already hold). `reserved_out_tokens`: what copies under way still
        have to move, into host slots they reserved already (so not counted again against free ones).
        `batch_tokens`: the batch whose forward pass the copies hide behind (the paper's, and the
        default: the previous iteration's)."""
        batch = self.last_batch_tokens if batch_tokens is None else max(1, batch_tokens)
        n = int(swap_limit_tokens(self.profile, batch) * self.overlap)
        b = split_swap_budget(n, want_out_tokens, want_in_tokens, self.slots.num_free * self.block_size + reserved_out_tokens,
                              device_free_blocks * self.block_size)
        self._step = StepSwap(limit=n, out_budget=b.out_tokens, in_budget=b.in_tokens)
        self.in_budget_blocks = b.in_tokens // self.block_size
        self.prefetch_blocks = 0
        return b

    @property
    def limit_tokens(self) -> int:
        """N_i of the iteration `budgets` last planned (0 before the first)."""
        return self._step.limit if self._step is not None else 0

    def spare_blocks(self) -> int:
        """Link capacity of the step being planned (N_i, in blocks) that neither its swap-in budget nor
        the copies out planned so far take: what prefetches may move without lengthening the step."""
        if self._step is None:
            return 0
        return max(0, self._step.limit // self.block_size - self.in_budget_blocks - len(self._out))

    def observe_overlap(self, window_s: float, forward_s: float, weight: float = 0.05) -> None:
        """Fold one step's measured forward window (the time its copies can hide behind) into `overlap`."""
        if window_s > 0 and forward_s > 0:
            self.overlap = (1 - weight) * self.overlap + weight * min(1.0, window_s / forward_s)

    def plan_out(self, host: HostCopy, block_ids: list[int], max_blocks: int) -> int:
        """Queue the next up-to-`max_blocks` blocks of a reserved copy for this step; returns how many."""
        start = host.copied_out
        n = max(0, min(max_blocks, len(host.slots) - start))
        self._out.extend(zip(block_ids[start:start + n], host.slots[start:start + n]))
        host.copied_out += n
        self.stats.blocks_out += n
        if n and host.out_complete:
            self.stats.tokens_out += host.tokens
        return n

    def plan_copy_out(self, copying: list[tuple[HostCopy, Callable[[], list[int]]]], budget_tokens: int) -> None:
        """Plan this step's copy-out, oldest first, within the budget. `copying` pairs each copy with its
        request's device block ids (asked only when it moves). A budget under one block still moves one
        block, so copies always finish."""
        todo = [(h, ids) for h, ids in copying if not h.out_complete]
        blocks = max(budget_tokens // self.block_size, 1 if todo else 0)
        for host, ids in todo:
            if blocks <= 0:
                break
            blocks -= self.plan_out(host, ids(), blocks)

    def how_many_to_arm(self, queued: list[HostCopy], loading: list[HostCopy], first_at_head: bool = False) -> int:
        """How many of the queued swap-ins (first come, first served) to arm this step: while fewer
        blocks wait to be copied in than one step moves. An armed request gets its device blocks from
        vLLM and is copied in over the next steps. The first is armed anyway when it heads vLLM's
        waiting queue: held back there, vLLM would skip it, and newer arrivals would take the memory it
        waits for again and again; armed, it holds its place (vLLM waits for room there)."""
        pipeline = sum(h.blocks_to_load for h in loading)
        n = 0
        for host in queued:
            if pipeline >= max(1, self.in_budget_blocks):
                break
            pipeline += len(host.slots)
            n += 1
        return max(n, 1) if first_at_head and queued else n

    def take_copies(self, loading: list[tuple[str, HostCopy]], abandoned: list[str],
                    reused: Collection[int] = (), fetching: list[tuple[str, HostCopy]] | None = None) -> StepCopies:
        """The step's copies: what `plan_out` queued, and swap-in chunks of the loading requests, in
        order, within the step's swap-in budget (a budget under one block still moves one, so loads
        always finish), then chunks of the prefetches under way (`fetching`) within `prefetch_blocks`.
        `reused`: device blocks released in this step that the engine reallocated (their copies out go
        first). `loads_done` names both kinds whose last chunk is in this step."""
        swap_in: list[tuple[int, int]] = []
        done = list(abandoned)
        for group, budget in ((loading, self.in_budget_blocks or (1 if loading else 0)),
                              (fetching or [], self.prefetch_blocks)):
            for rid, host in group:
                if budget <= 0:
                    break
                assert host.to_load is not None
                while host.to_load and budget > 0:
                    swap_in.append(host.to_load.popleft())
                    budget -= 1
                if not host.to_load:
                    done.append(rid)
                    self.stats.tokens_in += host.tokens - host.hit_tokens
        self.stats.blocks_in += len(swap_in)
        out, self._out = self._out, []
        first = [p for p in out if p[0] in reused] if reused else []
        if first:
            out = [p for p in out if p[0] not in reused]
            self.stats.blocks_out_first += len(first)
        if self._step is not None:
            b = self.block_size
            self.history.append(StepSwap(self._step.limit, self._step.out_budget, self._step.in_budget,
                                         (len(out) + len(first)) * b, len(swap_in) * b))
            self._step = None
        return StepCopies(swap_out=out, swap_in=swap_in, loads_done=done, swap_out_first=first)

    def last_step_stall_s(self, step_seconds: float) -> float:
        """What the last step's copies added to its time (an estimate from the profile's bandwidth).
        CPU copies share the cores with the forward pass: all of it. On CUDA (or an emulated link) they
        run beside the forward pass: only what outlasts the step's compute."""
        if not self.history:
            return 0.0
        last = self.history[-1]
        copy_s = self.profile.t_swap_out_s(last.out_moved) + self.profile.t_swap_in_s(last.in_moved)
        return copy_s if self.profile.device == "cpu" else max(0.0, copy_s - (step_seconds - copy_s))

