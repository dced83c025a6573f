"""A simulated agent request: the scheduler-side state vLLM keeps for it, and the turns the benchmark's
replay drives it through (`infercept.benchmarks.replay.replay`: each turn generates the workload's decode tokens,
pauses as an intercept of the request's type, the call lasts its sampled duration, and the resume
appends the tool's returned tokens)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from infercept.benchmarks.workload import Request


class Status(IntEnum):
    WAITING = 0  # in a queue, schedulable
    RUNNING = 1
    PREEMPTED = 2  # vLLM's recompute preemption (in the waiting queue, num_computed = 0)
    PAUSED = 3  # WAITING_FOR_STREAMING_REQ: turn ended, waiting for the call to return
    LOADING = 4  # WAITING_FOR_REMOTE_KVS: blocks allocated, swap-in chunks copying
    FINISHED = 5


@dataclass(frozen=True)
class Turn:
    decode_tokens: int
    call_s: float | None  # None: the request's last turn (no call after it)
    returned_tokens: int = 0


@dataclass(eq=False)
class SimRequest:
    rid: str
    session_id: str
    aug_type: str
    expected_call_s: float | None  # the session's hint for its type (Table 1 mean, scaled)
    arrival_s: float  # when the benchmark opened it
    turns: list[Turn]
    prompt_tokens: int
    # vLLM's view
    arrival_time: float = 0.0  # queue order; a resume may requeue it with a new one
    num_tokens: int = 0  # tokens in the context, the uncomputed ones included
    num_computed: int = 0
    status: Status = Status.WAITING
    blocks: list[int] = field(default_factory=list)
    cached_blocks: int = 0  # leading blocks registered in the prefix cache
    queue_pos: int = 0  # position in the KV-holding queue (vLLM's FCFS deque)
    key: int = 0  # prefix-cache key of its first block (the scheduler assigns it)
    turn: int = 0
    turn_left: int = 0  # tokens still to sample in this turn
    # what the benchmark measures
    output_tokens: int = 0
    call_s: float = 0.0  # calls completed (the replay adds each after its sleep)
    first_token_s: float | None = None
    end_s: float | None = None
    steps_in_call: int = 0
    # the current turn as the replay times it (`metrics.Turn`): sent by the front end, first token seen there
    turn_sent_s: float = 0.0  # the first turn's: its arrival (`SimEngine.submit`)
    turn_first_s: float | None = None
    turn_in_tokens: int = 0
    turn_out_tokens: int = 0
    turn_log: list[tuple[int, int, int, float, float, float]] = field(default_factory=list)  # (index, in, out, sent, first, end)

    def __post_init__(self) -> None:
        self.arrival_time = self.arrival_s
        self.num_tokens = self.prompt_tokens
        self.turn_in_tokens = self.prompt_tokens
        self.turn_left = self.turns[0].decode_tokens


def from_workload(req: Request, time_scale: float, *, zero_calls: bool = False,
                  rid_prefix: str = "r", arrival_s: float | None = None) -> SimRequest:
    """The simulator's copy of one workload request, as the benchmark replays it (call durations
    scaled by `time_scale`; zero-time calls for the SLO's reference). As in the benchmark's replay, the
    engine is told the call's type but not its expected duration."""
    turns = [Turn(c.decode_tokens, 0.0 if zero_calls else c.duration_s * time_scale, c.returned_tokens) for c in req.calls]
    turns.append(Turn(req.final_decode_tokens, None))
    rid = f"{rid_prefix}{req.rid}"
    return SimRequest(rid=rid, session_id=rid, aug_type=req.aug_type, expected_call_s=None,
                      arrival_s=req.arrival_s if arrival_s is None else arrival_s, turns=turns,
                      prompt_tokens=len(req.prompt))
