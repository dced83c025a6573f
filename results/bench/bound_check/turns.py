"""Per-turn timing of one (policy, seed, rate) bench run: where does a request's engine time go?"""
import asyncio, json, random, sys, time, statistics
from pathlib import Path
import benchmarks.replay as R
from benchmarks.runner import Plan, make_workloads, context_tokens
from benchmarks.replay import VARIANTS, EngineRun, Setting
from benchmarks.workload import PRIORS
import yaml

TURNS = []

async def replay(engine, req, v, s, t0, out):
    from engine_adapter.events import TokenDelta, TurnEnd
    from engine_adapter.hints import TURN_END_KEY, ToolHint
    table_mean = R.TABLE1[req.aug_type].duration_s[0]
    await asyncio.sleep(max(0.0, t0 + req.arrival_s - time.monotonic()))
    out.arrival_s = time.monotonic()
    rng = random.Random(req.rid)
    session = engine.open_session(tools={TURN_END_KEY: ToolHint(req.aug_type, table_mean * s.time_scale)},
                                  max_tokens=8, ignore_eos=True, seed=req.rid)
    try:
        tokens = list(req.prompt)
        steps = [(c.decode_tokens, c) for c in req.calls] + [(req.final_decode_tokens, None)]
        for i, (decode, call) in enumerate(steps):
            ts = time.monotonic(); tf = None; n = 0
            async for ev in session.turn(tokens, max_tokens=decode):
                if isinstance(ev, TokenDelta):
                    if tf is None: tf = time.monotonic()
                    if out.first_token_s is None: out.first_token_s = tf
                elif isinstance(ev, TurnEnd):
                    n = len(ev.token_ids); out.output_tokens += n
            te = time.monotonic()
            TURNS.append(dict(rid=req.rid, typ=req.aug_type, i=i, in_tokens=len(tokens), out=n, send=ts - t0, first=(tf or te) - ts, total=te - ts))
            if call is None: break
            duration = call.duration_s * s.time_scale
            c0 = time.monotonic(); await asyncio.sleep(duration); out.call_s += time.monotonic() - c0
            tokens = R.random_tokens(rng, call.returned_tokens)
        out.end_s = time.monotonic()
    except Exception as e:
        out.error = f"{type(e).__name__}: {e}"
    finally:
        await session.close()

R.replay = replay

async def main(label, seed, rate, tag):
    s = Setting()
    out = Path("/tmp/bound_check"); out.mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load(PRIORS.read_text())
    for st in doc["types"].values():
        st["duration_s"] = [x * s.time_scale for x in st["duration_s"]]
    s.priors_path = str(out / "priors.yaml"); Path(s.priors_path).write_text(yaml.safe_dump(doc))
    plan = Plan(workload="mixed", labels=[label], rates=[4.0, 8.0, 12.0], duration_s=10.0, seeds=[seed], token_budget=512,
                tune=False, ablation=False, slo_factor=5.0, setting=s, out=out, command="")
    wl = make_workloads(plan)
    s.unlimited_kv_tokens = max(sum(context_tokens(r) for r in reqs) for reqs in wl.values())
    async with EngineRun(VARIANTS[label], s, 512) as er:
        res = await er.run(wl[(seed, rate)], rate)
    print(label, seed, rate, "median nl %.4f" % res["normalized_latency_s"]["median"], res["completed"], "/", res["requests"])
    Path(f"results/bench/bound_check/turns_{tag}.json").write_text(json.dumps({"summary": res["normalized_latency_s"], "turns": TURNS}))

if __name__ == "__main__":
    label, seed, rate, tag = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    asyncio.run(main(label, seed, rate, tag))
