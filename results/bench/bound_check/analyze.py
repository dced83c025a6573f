"""Summarize `turns_<tag>.json` files with the bench's own per-turn measures (`benchmarks.metrics.turn_timing`).

    PYTHONPATH=. python3 results/bench/bound_check/analyze.py bound ic bound2 ic2 bound3 ic3
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.metrics import Turn, turn_timing

HERE = Path(__file__).resolve().parent


def ms(x: float) -> float:
    return x * 1000


for tag in sys.argv[1:]:
    d = json.loads((HERE / f"turns_{tag}.json").read_text())
    turns = [Turn(**t) for t in d["turns"]]
    tt = turn_timing(turns)
    out = sum(t.out_tokens for t in turns)
    first = sum(t.first_s for t in turns)
    total = sum(t.total_s for t in turns)
    print(f"{tag:12s} nl_med {ms(d['summary']['median']):.1f}ms turns {tt['turns']} out {out}"
          f" sum(turn time)/out {ms(tt['turn_time_per_output_token_s']):.2f}ms"
          f" | new-ttft med {ms(tt['new_first_token_s']['median']):.1f} p90 {ms(tt['new_first_token_s']['p90']):.1f}"
          f" | resume-ttft med {ms(tt['resume_first_token_s']['median']):.1f} p90 {ms(tt['resume_first_token_s']['p90']):.1f}"
          f" | per-token decode med {ms(tt['decode_per_token_s']['median']):.2f} p90 {ms(tt['decode_per_token_s']['p90']):.2f} ms"
          f" | sum ttft {first:.1f}s sum decode {total - first:.1f}s")
