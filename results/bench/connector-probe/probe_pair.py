"""The swap connector's fixed cost per step, paired: engines of several policies alive at once (idle ones block
on their input queue), the bench's decode probe alternated between them probe by probe, so that each comparison
is made under the same machine state. Usage: probe_pair.py PROFILE ROUNDS POLICIES OUT"""
import asyncio, json, statistics as st, sys, time
from contextlib import AsyncExitStack
from infercept.benchmarks.replay import EngineRun, Setting, decode_probe, variant

async def main() -> None:
    profile, rounds, pols, out = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4]
    s = Setting(profile=profile)
    async with AsyncExitStack() as stack:
        runs = {p: await stack.enter_async_context(EngineRun(variant(p), s, 1024)) for p in pols}
        for r in runs.values():
            await decode_probe(r.engine)
        rows = []
        for i in range(rounds):
            order = pols if i % 2 == 0 else pols[::-1]
            row = {p: 1e3 * (await decode_probe(runs[p].engine) or float("nan")) for p in order}
            rows.append(row)
            print(i, json.dumps({k: round(v, 2) for k, v in row.items()}), flush=True)
    base = pols[0]
    summary = {p: {"probe_ms_median": st.median(r[p] for r in rows),
                   "ratio_to_" + base + "_median": st.median(r[p] / r[base] for r in rows),
                   "ratio_p25_p75": sorted(r[p] / r[base] for r in rows)[len(rows) // 4::max(1, len(rows) // 2)][:2]} for p in pols}
    print(json.dumps(summary, indent=1))
    json.dump({"rows": rows, "summary": summary, "when": time.strftime("%FT%T%z"), "policies": pols}, open(out, "w"), indent=1)

if __name__ == "__main__":
    asyncio.run(main())
