"""Summarize a diag.jsonl written by diag.patch (one line per scheduler step that left new requests waiting):
why they waited, what held the KV blocks meanwhile, and how long the waits for blocks lasted. (A line's
`view` is the step view after the schedule: its head is the first waiting request vLLM could admit, a
held-back swap-in included, not the new request the scan stopped at; it is not used here.)"""
import collections
import gzip
import json
import sys

opener = gzip.open if sys.argv[1].endswith(".gz") else open
lines = [json.loads(x) for x in opener(sys.argv[1], "rt")]
reasons = collections.Counter(x["reason"] for x in lines)
blocks = [x for x in lines if x["reason"] == "blocks"]
c = collections.Counter()
for x in blocks:
    s = x["states"]
    c["steps"] += 1
    c["head_is_new"] += bool(x["head_new"])
    c["swap_ins_under_way"] += bool(s.get("LOAD_ARMED") or s.get("LOADING"))
    c["swap_ins_queued"] += bool(s.get("LOAD_QUEUED"))
    c["kv_preserved_on_the_device"] += bool(s.get("PRESERVED"))
# Episodes: runs of steps with a wait for blocks less than 50 ms apart.
t = [x["t"] for x in blocks]
episodes, start, prev = [], t[0], t[0]
for x in t[1:]:
    if x - prev > 0.05:
        episodes.append(prev - start)
        start = x
    prev = x
episodes.append(prev - start)
print(json.dumps({"steps_with_new_requests_waiting": len(lines), "by_reason": reasons, "waits_for_blocks": c,
                  "free_blocks_after_the_step_median": sorted(x["free"] for x in blocks)[len(blocks) // 2],
                  "episodes": len(episodes), "longest_episodes_s": sorted(round(e, 3) for e in episodes)[-5:],
                  "episode_seconds_total": round(sum(episodes), 3)}, indent=1))
