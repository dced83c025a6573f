"""Per-step diagnostics shared by the engine (scheduler patch) and the simulator (monkeypatch): where the
device blocks are after a schedule, and whether new requests were left waiting, and why."""
import json
import os
from collections import Counter


def line(core, now, running_blocks, running, waiting_new, reason, sched_tokens, free, loads_admitted, extra=None):
    st, bl = Counter(), Counter()
    for e in core.entries.values():
        st[e.state.name] += 1
        try:
            bl[e.state.name] += len(core.kv.block_ids(e.request_id))
        except Exception:
            pass
    with open(os.environ["IC_DIAG"], "a") as f:
        f.write(json.dumps(dict(t=now, tok=sched_tokens, free=free, run=running, run_blocks=running_blocks,
                                wn=waiting_new, why=reason, adm_loads=loads_admitted, st=st, bl=bl, **(extra or {}))) + "\n")
