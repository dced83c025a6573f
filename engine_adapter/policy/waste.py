"""The InferCept paper's memory-waste equations (GPU memory x time), units in the names.

Waste is measured in byte-seconds: memory held while it produces nothing, times how long. Inputs are
token counts, seconds and a `Profile` (T_fwd, T_swap, M); outputs are numbers. Pure: a simulator can
import this module as it is.

Paper equations (section numbers of the ICML 2024 paper's Sec. 4):
  Eq. 1  WasteDiscard   = T_fwd(C) * C * M + T_fwd(C) * C_other * M
  Eq. 2  WastePreserve  = T_INT * C * M
  Eq. 3  WasteSwap      = 2 * T_swap(C) * C_batch * M                (synchronous, unbudgeted swap)
  Eq. 4  WasteChunkD    = T_fwd(C) * C * M / 2 + n * T_fwd(C / n) * C_other * M
  Eq. 5  Waste          = min(WastePreserve, WasteChunkD)
Swap limit (Sec. 4.2): N_i with T_swap(N_i) = T_fwd(B_i): the tokens whose copy hides behind the
iteration's forward pass, split between swap-out and swap-in under the CPU and GPU memory limits.

Extension where the paper is silent: a discarded context whose first `cached_tokens` are still in the
prefix cache only recomputes the rest (`C - cached`); the chunked-discard waste is computed for that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine_adapter.policy.profile import Profile, chunks_needed


def waste_preserve_byte_s(t_int_s: float, context_tokens: int, kv_bytes_per_token: int) -> float:
    """Eq. 2: the context's KV held idle for the call's (remaining) duration."""
    return max(0.0, t_int_s) * context_tokens * kv_bytes_per_token


def waste_discard_byte_s(p: Profile, context_tokens: int, other_tokens: int) -> float:
    """Eq. 1: recompute the whole context in one iteration; everyone else waits for it."""
    t = p.t_fwd_s(context_tokens)
    return t * context_tokens * p.kv_bytes_per_token + t * other_tokens * p.kv_bytes_per_token


def waste_chunked_discard_byte_s(
    p: Profile, context_tokens: int, other_tokens: int, chunk_tokens: int, cached_tokens: int = 0
) -> float:
    """Eq. 4: recompute in n chunks of at most `chunk_tokens` (S minus the running batch). The
    recomputing request's own memory grows chunk by chunk (hence the /2); the others wait n extra
    chunk-times. `cached_tokens` still hit in the prefix cache are not recomputed (our extension)."""
    todo = max(0, context_tokens - cached_tokens)
    if todo == 0:
        return 0.0
    n = chunks_needed(todo, chunk_tokens)
    m = p.kv_bytes_per_token
    return p.t_fwd_s(todo) * todo * m / 2 + n * p.t_fwd_s(todo / n) * other_tokens * m


def waste_swap_byte_s(p: Profile, context_tokens: int, batch_tokens: int) -> float:
    """Eq. 3: a synchronous swap out and back in stalls the whole batch (C_batch tokens) twice."""
    t = (p.t_swap_out_s(context_tokens) + p.t_swap_in_s(context_tokens)) / 2
    return 2 * t * batch_tokens * p.kv_bytes_per_token


def waste_min_byte_s(
    p: Profile, t_int_s: float, context_tokens: int, other_tokens: int, chunk_tokens: int, cached_tokens: int = 0
) -> tuple[float, str]:
    """Eq. 5: the cheaper of preserving and chunked discarding, and which one it is."""
    wp = waste_preserve_byte_s(t_int_s, context_tokens, p.kv_bytes_per_token)
    wd = waste_chunked_discard_byte_s(p, context_tokens, other_tokens, chunk_tokens, cached_tokens)
    return (wp, "preserve") if wp <= wd else (wd, "discard")


def recompute_chunk_tokens(p: Profile, running_batch_tokens: int, min_chunk_tokens: int = 16) -> int:
    """Chunk size for recomputation: the saturation point S minus what the running batch already
    schedules this iteration (never below a small floor, so a recompute always progresses)."""
    return max(min_chunk_tokens, p.saturation_tokens - running_batch_tokens)


def swapped_blocks(context_tokens: int, block_size: int) -> int:
    """Blocks (host slots) a swapped context takes and its copy moves: all of them, the partly filled
    last block too (copied whole), so the context comes back with nothing to recompute."""
    return -(-context_tokens // block_size)


def swap_limit_tokens(p: Profile, batch_tokens: int) -> int:
    """N_i: tokens whose swap time fits in the iteration's forward time T_fwd(B_i), so the copy hides
    behind compute. Uses the slower direction, so either split of it fits."""
    t = p.t_fwd_s(max(1, batch_tokens))
    bw = min(p.swap_out_bytes_per_s, p.swap_in_bytes_per_s)
    return int(math.floor(t * bw / p.kv_bytes_per_token))


@dataclass(frozen=True)
class SwapBudget:
    out_tokens: int
    in_tokens: int


def split_swap_budget(
    limit_tokens: int, want_out_tokens: int, want_in_tokens: int, host_free_tokens: int, device_free_tokens: int
) -> SwapBudget:
    """Split N_i between swap-out and swap-in (Sec. 4.2), favouring swap-in: restored requests add
    work to the iteration right away, which is what the paper maximises. Guarantees:
      1. out + in <= N_i
      2. out <= host free + in          (the host buffer must hold what goes out)
      3. in <= device free + out        (the device must hold what comes in; `device_free_tokens` counts
                                         the blocks loads under way already hold as free for their copies)
    """
    n = max(0, limit_tokens)
    host, dev = max(0, host_free_tokens), max(0, device_free_tokens)
    in_t = min(want_in_tokens, n, dev)
    out_t = min(want_out_tokens, n - in_t, host + in_t)
    # Swap-out frees device memory this iteration; let swap-in use it if it was short of room.
    if in_t < want_in_tokens:
        more = min(want_in_tokens - in_t, n - in_t - out_t, out_t + dev - in_t)
        in_t += max(0, more)
    return SwapBudget(out_tokens=max(0, out_t), in_tokens=max(0, in_t))
