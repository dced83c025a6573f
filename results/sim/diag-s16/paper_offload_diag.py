"""Why `vllm-offload` collapses at paper scale (GPT-J-6B on the A100 profile, `infercept simulate --paper`'s
setting): one seed at one rate, with the host tier's counters and a per-step sample of its link backlog
and flush stalls. Usage: paper_offload_diag.py SEED RATE [POLICY [HOST_GIB [TIER_VARIANT]]]
TIER_VARIANT: lru (vLLM's), dead_first (a finished session's blocks are evicted first instead of becoming
the most recently used), dead_dropped (and dropped at once), pause_mru (a pausing session's blocks become the most recently used);
'+'-joined."""
import collections
import sys

from infercept.benchmarks.sim.paper import PaperRun
from infercept.benchmarks.sim.run import run_rate, sim_requests
from infercept.benchmarks.sim.workloads import bench_workloads

seed, rate = int(sys.argv[1]), float(sys.argv[2])
label = sys.argv[3] if len(sys.argv) > 3 else "vllm-offload"
pr = PaperRun(seeds=(seed,), rates=(rate,), policies=(label,))
sb = pr.bench()
if len(sys.argv) > 4:  # another host buffer than the paper's 128 GiB
    sb.setting.swap_space_gib = float(sys.argv[4])
w, _ = bench_workloads("mixed", [rate], pr.duration_s, seed, context_scale=1.0, max_context=3500)
eng = sb.engine(label)
tier = eng.sched.host_tier
tier_variant = sys.argv[5] if len(sys.argv) > 5 else "lru"
if tier is not None and tier_variant != "lru":
    from common import dead_sessions, pause_mru
    for part in tier_variant.split("+"):
        if part == "pause_mru":
            pause_mru(eng)
        else:
            dead_sessions(tier, drop=part == "dead_dropped")
acc = collections.Counter()
orig = eng._step


def step():
    t0 = eng.now
    stall0 = tier.stall_s if tier else 0.0
    ran = orig()
    acc["steps"] += 1
    acc["step_s"] += eng.now - t0
    if tier is not None:
        acc["link_backlog_s"] += max(0.0, tier._link_free_at - eng.now)
        acc["loads_on_link"] += len(tier._loads)
    acc["running"] += len(eng.sched.running)
    acc["waiting"] += len(eng.sched.waiting)
    acc["free_blocks"] += eng.sched.pool.num_free()
    return ran


eng._step = step
reqs = sim_requests(w[rate], sb, label, prefix=f"{rate:g}-")
out = run_rate(eng, reqs, sb.setting.drain_s, sb.setting.kv_tokens)
n = max(1, acc["steps"])
print(f"{label} seed {seed} rate {rate}: nl median {out['normalized_latency_s']['median'] * 1e3:.1f} ms; "
      f"ttft p99 {out['ttft_s']['p99']:.2f} s; resume p50/p99 {out['resume_s']['median']:.2f}/{out['resume_s']['p99']:.2f} s; "
      f"completed {out['completed']}/{out['requests']}; recomputed {out['recomputed_tokens']}; prefix hits {out['prefix_hit_tokens']}; "
      f"preemptions {out['preemptions']}; host tier {out.get('host_tier')}")
print(f"  per step (mean over {n}): {(acc['step_s'] / n) * 1e3:.1f} ms; running {acc['running'] / n:.1f}; waiting "
      f"{acc['waiting'] / n:.1f}; free blocks {acc['free_blocks'] / n:.0f} of {eng.sched.pool.num_blocks}; link backlog "
      f"{acc['link_backlog_s'] / n * 1e3:.1f} ms; loads on the link {acc['loads_on_link'] / n:.2f}")
if tier is not None:
    print(f"  block bytes {tier.block_bytes}, link {tier.link_bytes_per_s}, capacity {tier.capacity} blocks; deferred lookups {tier.deferred_lookups}")
