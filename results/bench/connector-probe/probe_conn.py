"""The KV connector's fixed cost per step: the bench's decode probe (one request alone, 1,024-token context,
48 tokens) on idle engines of several policies, interleaved in shuffled rounds, with each engine's forward
seconds per step and step parts over the probes. Usage: probe_conn.py PROFILE ROUNDS POLICIES OUT"""
import asyncio, json, random, statistics as st, sys, time
from infercept.benchmarks.replay import EngineRun, Setting, decode_probe, variant

async def main() -> None:
    profile, rounds, pols, out = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4]
    s = Setting(profile=profile)
    res = {p: [] for p in pols}
    rng = random.Random(20)
    for r in range(rounds):
        order = pols[:]; rng.shuffle(order)
        for p in order:
            async with EngineRun(variant(p), s, 1024) as run:
                await decode_probe(run.engine)  # warm
                st0 = await run.engine.stats()
                probes = [await decode_probe(run.engine) for _ in range(5)]
                st1 = await run.engine.stats()
                it = st1.waste.iterations - st0.waste.iterations
                fw = st1.waste.forward_s - st0.waste.forward_s
                parts = {k: (st1.step_parts_s or {}).get(k, 0) - (st0.step_parts_s or {}).get(k, 0) for k in (st1.step_parts_s or {})}
                row = {"round": r, "probe_ms": [1e3 * x for x in probes if x], "forward_ms_per_step": 1e3 * fw / max(1, it), "steps": it,
                       "parts_ms_per_step": {k: 1e3 * v / max(1, it) for k, v in parts.items()}}
                res[p].append(row)
                print(p, r, json.dumps(row), flush=True)
    summary = {p: {"probe_ms_median": st.median([x for row in rows for x in row["probe_ms"]]),
                   "forward_ms_per_step_median": st.median(row["forward_ms_per_step"] for row in rows)} for p, rows in res.items()}
    print(json.dumps(summary, indent=1))
    json.dump({"rows": res, "summary": summary, "when": time.strftime("%FT%T%z")}, open(out, "w"), indent=1)

if __name__ == "__main__":
    asyncio.run(main())
