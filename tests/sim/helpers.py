"""A toy device for exact simulator tests: every step costs the same 10 ms (or a given grid), swaps a
given bandwidth, and an engine setting small enough to reason about by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infercept.benchmarks.sim.request import SimRequest, Turn
from infercept.benchmarks.sim.setup import SimBench, make_setting
from engine_adapter.policy.profile import Profile

STEP_S = 0.01
M = 100  # KV bytes per token


def toy_profile(step_s: float = STEP_S, swap_bytes_per_s: float = 1e12, device: str = "cuda",
                extra: dict[str, Any] | None = None, saturation: int = 4096) -> Profile:
    return Profile(model="toy", device=device, fwd_tokens=(1, 8192), fwd_seconds=(step_s, step_s), saturation_tokens=saturation,
                   kv_bytes_per_token=M, swap_out_bytes_per_s=swap_bytes_per_s, swap_in_bytes_per_s=swap_bytes_per_s,
                   source="toy", extra=extra or {})


def toy_bench(tmp: Path, *, kv_tokens: int = 16 * 1024, block_size: int = 16, max_num_seqs: int = 64, budget: int = 4096,
              profile: Profile | None = None, swap_space_gib: float = 1.0, time_scale: float = 1.0,
              ttl_s: dict[str, float] | None = None) -> SimBench:
    s = make_setting(model="toy", block_size=block_size, kv_tokens=kv_tokens, max_model_len=8192, max_num_seqs=max_num_seqs,
                     swap_space_gib=swap_space_gib, swap_link_gbps=None, time_scale=time_scale, drain_s=600.0)
    return SimBench(s, profile or toy_profile(), default_budget=budget, workdir=tmp)


def request(rid: str, prompt: int, turns: list[tuple[int, float | None, int]], arrival: float = 0.0,
            aug_type: str = "tts", expected: float | None = 10.0) -> SimRequest:
    return SimRequest(rid=rid, session_id=rid, aug_type=aug_type, expected_call_s=expected, arrival_s=arrival,
                      turns=[Turn(d, c, r) for d, c, r in turns], prompt_tokens=prompt)
