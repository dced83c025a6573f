"""Print an A/B of `infercept` from two re-runs (`python -m benchmarks.rerun`) of one bench's workloads, side by side:
per seed and rate, median normalized latency, finished requests, discards by the policy, recomputed tokens, swapped-out
tokens, demotions and the waste split (% of KV capacity x time).

    python results/bench/defer_ab/summary.py OLD/bench.json NEW/bench.json [policy]
"""
import json
import sys

old, new = (json.load(open(p)) for p in sys.argv[1:3])
pol = sys.argv[3] if len(sys.argv) > 3 else "infercept"
print("version seed rate  median latency  finished  discarded  recomputed  swapped-out  demoted  waste (preserved-idle / recompute / swap stall)  mean JCT")
for name, b in (("old", old), ("new", new)):
    for seed, by_rate in b["results"][pol].items():
        for rate, r in by_rate.items():
            w = r["waste_share_by_kind"]
            print(f"{name:7} {seed:4} {rate:>4} {1e3 * r['normalized_latency_s']['median']:10.1f} ms  {r['completed']:3}/{r['requests']:<3}"
                  f"  {r['discarded']:9}  {r['recomputed_tokens']:10}  {r['swapped_out_tokens']:11}  {r['demoted']:7}"
                  f"  {100 * r['waste_share_of_capacity_time']:5.2f}% ({100 * w['preserved_idle']:.2f} / {100 * w['recompute']:.2f} / {100 * w['swap_stall']:.2f})"
                  f"  {r['jct_s']['mean']:5.1f} s")
print("\npreserved-idle by augmentation type, % of KV capacity x time (intercepts)")
for name, b in (("old", old), ("new", new)):
    for seed, by_rate in b["results"][pol].items():
        for rate, r in by_rate.items():
            cap_s = r["capacity_tokens"] * r["wall_s"]
            print(f"{name:7} {seed:4} {rate:>4}  " + "  ".join(
                f"{t} {100 * x['preserved_token_seconds'] / cap_s:.2f} ({x['intercepts']})" for t, x in r["by_type"].items()))
