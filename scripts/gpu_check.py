"""The first thing to run on a GPU: does the swap connector's copy path (`engine_adapter/kv_copy.py`)
do on CUDA what the CPU tests can only check in simulation? Needs torch only (not this project's vLLM),
runs in well under 5 minutes, prints one table (and writes it as JSON to $OUT/gpu_check.json when OUT
is set), exits 1 when a check fails.

    python scripts/gpu_check.py             # on a GPU; about a minute on an H100/H200
    python scripts/gpu_check.py --dry-run   # the same code paths on CPU tensors and simulated streams

Checks (issue 31; each names the defect it catches):
  no_host_sync     a torch.cuda._sleep queued on the compute stream must not delay the copy calls'
                   return (hidden host syncs: blocking index uploads, syncs of the side stream).
  overlap_out/in   a busy kernel plus a step's copies out (in) must take about the max, not the sum:
                   copies wait on the bind-time event, not on the forward pass.
  stall_measured   the stall the step measures (events) matches the wall clock's excess over the kernel.
  pinned_exact     one flat, exact-size pinned buffer, not power-of-two-rounded: torch's pinned-memory
                   statistics grow by the requested bytes (within 3%), or not at all where a torch without
                   the exact-size setting (2.11) gets it registered in place with cudaHostRegister.
  first_copy       the first copy is not slower than the tenth (the buffer is pinned at start, not at
                   the first swap).
  round_trip:*     out to the host and back into other blocks, bit-exact, through vLLM 0.32's strided
                   views (NHD, HND, block-outermost; block 16, and 128 split into kernel blocks of
                   16/32/64), fp8 as bytes, a KV-sharing layer copied once, and blocks reused (written
                   by the forward) in the step that copies them out.
  bandwidth_out/in the copier's effective bandwidth is at least BANDWIDTH_FRACTION of raw pinned
                   bandwidth (one large contiguous copy).

The dry run (automatic without CUDA) runs the same copier code with `FakeStreams`: deferred CPU streams
that execute queued work only when waited for, unordered work in an adversarial order. Its timing rows
are informative only (CPU copies, pageable memory); its ordering and exactness rows are enforced.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine_adapter.kv_copy import BlockCopier, CudaStreams, FakeStreams  # noqa: E402

BANDWIDTH_FRACTION = 0.6  # effective copy bandwidth over raw pinned bandwidth, at least
OVERLAP_SLACK = 0.25  # overlapped time <= max + this x min (the sum would be max + 1.0 x min)
HOST_STATS_TOLERANCE = 0.03

# vLLM 0.32's layouts (vllm/v1/kv_cache_layout.py): the physical order of the logical [L, B, H, N, C].
LAYOUTS = {"NHD": (0, 1, 3, 2, 4), "HND": (0, 1, 2, 3, 4), "BL-NHD": (1, 0, 3, 2, 4), "BL-HND": (1, 0, 2, 3, 4)}


def vllm_layer_views(raw: torch.Tensor, layers: int, num_blocks: int, heads: int, head_size: int, dtype: torch.dtype,
                     block_size: int, kernel_block: int, layout: str) -> list[torch.Tensor]:
    """Per-layer `[B * r, H, N, C]` views of a flat int8 buffer, as vLLM 0.32's `create_kv_cache_views`
    builds them for full attention (K and V of a token side by side in C; unpadded pages). The CPU tests
    check this against vLLM's own function."""
    esize = torch.empty(0, dtype=dtype).element_size()
    r = block_size // kernel_block
    cbytes = 2 * head_size * esize
    page = heads * block_size * cbytes
    order = LAYOUTS[layout]
    layer_compact = order[0] == 0
    layer_stride, block_stride = (page * num_blocks, page) if layer_compact else (page, page * layers)
    if r > 1:
        assert block_stride == page, "vLLM splits blocks into kernel blocks only where pages are dense"
        block_stride //= r
    shape = (layers, num_blocks * r, heads, kernel_block, cbytes)
    fixed = (layer_stride, block_stride, None, None, None)
    strides = [0] * 5
    cur = 1
    for dim in reversed(order):
        strides[dim] = fixed[dim] or cur
        cur = strides[dim] * shape[dim]
    assert raw.numel() >= layers * num_blocks * page
    v5 = torch.as_strided(raw, shape, strides, raw.storage_offset())
    return [v5[i].view(dtype) for i in range(layers)]


class Check:
    def __init__(self, dry: bool) -> None:
        self.dry = dry
        self.rows: list[dict[str, Any]] = []

    def row(self, name: str, ok: bool | None, measured: str, criterion: str) -> None:
        status = "INFO" if ok is None else ("PASS" if ok else "FAIL")
        self.rows.append({"check": name, "status": status, "measured": measured, "criterion": criterion})

    @property
    def failed(self) -> list[str]:
        return [r["check"] for r in self.rows if r["status"] == "FAIL"]

    def table(self) -> str:
        w = [max(len(str(r[k])) for r in self.rows + [{"check": "check", "status": "status", "measured": "measured",
                                                          "criterion": "criterion"}]) for k in ("check", "status", "measured")]
        lines = [f"{'check':<{w[0]}}  {'status':<{w[1]}}  {'measured':<{w[2]}}  criterion"]
        lines += [f"{r['check']:<{w[0]}}  {r['status']:<{w[1]}}  {r['measured']:<{w[2]}}  {r['criterion']}" for r in self.rows]
        return "\n".join(lines)


class Env:
    """CUDA, or the dry run: CPU tensors and FakeStreams."""

    def __init__(self, dry: bool, prefer: str = "compute") -> None:
        self.dry = dry
        self.device = torch.device("cpu" if dry else "cuda")
        self.prefer = prefer

    def streams(self) -> Any:
        return FakeStreams(self.prefer) if self.dry else CudaStreams(self.device)

    def sync(self, streams: Any) -> None:
        if self.dry:
            streams.drain()
        else:
            torch.cuda.synchronize()

    def busy(self, streams: Any, seconds: float, cycles_per_s: float) -> None:
        """A kernel that keeps the compute stream busy for `seconds` (dry run: an op that sleeps)."""
        if self.dry:
            streams.on(streams.compute(), lambda: time.sleep(seconds))
        else:
            torch.cuda._sleep(int(seconds * cycles_per_s))

    def on_compute(self, streams: Any, fn: Callable[[], None]) -> None:
        if self.dry:
            streams.on(streams.compute(), fn)
        else:
            fn()


def sleep_rate() -> float:
    """torch.cuda._sleep cycles per second on this GPU."""
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    n = 50_000_000
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(n)
    b.record()
    b.synchronize()
    return n / (a.elapsed_time(b) / 1e3)


def make_kv(env: Env, layers: int, blocks: int, heads: int, head: int, dtype: torch.dtype, block_size: int,
            kernel_block: int, layout: str, seed: int = 0) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    esize = torch.empty(0, dtype=dtype).element_size()
    nbytes = layers * blocks * heads * block_size * 2 * head * esize
    g = torch.Generator(device=env.device).manual_seed(seed)
    raw = torch.randint(-128, 128, (nbytes,), dtype=torch.int8, generator=g, device=env.device)
    views = vllm_layer_views(raw, layers, blocks, heads, head, dtype, block_size, kernel_block, layout)
    return {f"layers.{i}.attn": v for i, v in enumerate(views)}, raw


def block_bytes(kv: dict[str, torch.Tensor], name: str, num_blocks: int, b: int) -> torch.Tensor:
    t = kv[name].view(torch.uint8)
    return t.unflatten(0, (num_blocks, -1))[b].reshape(-1).to("cpu", copy=True)


# ============================================================================ checks
def check_round_trips(c: Check, env: Env, rate: float) -> None:
    cases = [("NHD", 16, 16), ("HND", 16, 16), ("BL-NHD", 16, 16), ("BL-HND", 16, 16),
             ("NHD", 128, 16), ("NHD", 128, 32), ("NHD", 128, 64), ("HND", 128, 16), ("HND", 128, 32), ("HND", 128, 64)]
    for layout, bs, kb in cases:
        for dtype in (torch.bfloat16, torch.float8_e4m3fn) if (layout, bs, kb) == ("NHD", 16, 16) else (torch.bfloat16,):
            ok = round_trip(env, layout, bs, kb, dtype, rate)
            name = f"round_trip:{layout}:bs{bs}:kb{kb}" + (":fp8" if dtype != torch.bfloat16 else "")
            c.row(name, ok, "bit-exact" if ok else "MISMATCH", "bytes (with the last writes before the step) equal after out + in")
    ok = round_trip(env, "NHD", 16, 16, torch.bfloat16, rate, shared=True)
    c.row("round_trip:kv_sharing", ok, "bit-exact, copied once" if ok else "MISMATCH or copied twice", "a shared layer's tensor is copied once")
    ok = round_trip(env, "HND", 128, 32, torch.bfloat16, rate, reused=True)
    c.row("round_trip:reused_in_step", ok, "bit-exact" if ok else "MISMATCH",
          "blocks overwritten by the forward in their copy's step come back as they were")


def round_trip(env: Env, layout: str, bs: int, kb: int, dtype: torch.dtype, rate: float, shared: bool = False,
               reused: bool = False) -> bool:
    blocks, layers, heads, head = 12, 3, 2, 32
    kv, _ = make_kv(env, layers, blocks, heads, head, dtype, bs, kb, layout)
    if shared:
        kv["layers.3.attn"] = kv["layers.1.attn"]  # KV sharing: the same tensor under another layer's name
    ref = {n: {b: block_bytes(kv, n, blocks, b) for b in range(blocks)} for n in kv}
    streams = env.streams()
    copier = BlockCopier(kv, blocks, host_slots=8, streams=streams)
    out = [(1, 5), (4, 0), (7, 3), (8, 4)]  # slots 3, 4, 5: one run; 0 alone
    if reused:
        if not env.dry:  # the side stream runs late: writes not ordered after its gathers would land first
            with torch.cuda.stream(streams.side):
                torch.cuda._sleep(int(0.1 * rate))
        idx = torch.tensor([d for d, _ in out], device=env.device)  # uploaded before: the writes do not sync
        copier.begin_step(swap_out_first=out)

        def forward_writes() -> None:
            for t in kv.values():
                t.view(torch.uint8).unflatten(0, (blocks, -1)).index_fill_(0, idx, 0)
        env.on_compute(streams, forward_writes)
    else:
        # The paused request's last KV writes, queued on the compute stream (behind a busy kernel) just
        # before the step: the copies must see them (the side stream waits on the bind-time event).
        env.busy(streams, 0.05, rate)
        d0 = out[0][0]

        def last_writes() -> None:
            for t in kv.values():
                t.view(torch.uint8).unflatten(0, (blocks, -1))[d0].fill_(0x5A)
        env.on_compute(streams, last_writes)
        for n in kv:
            ref[n][d0] = torch.full_like(ref[n][d0], 0x5A)
        copier.begin_step(swap_out=out)
        for n in kv:
            copier.copy_out(n)
    copier.finish()
    moved_ok = copier.bytes_moved == len(out) * sum(copier.page.values())
    copier.bytes_moved = 0
    env.sync(streams)
    for t in kv.values():
        t.view(torch.uint8).zero_()
    into = [(9, 5), (2, 0), (11, 3), (10, 4)]
    copier.begin_step(swap_in=into)
    copier.copy_in()
    copier.finish()
    env.sync(streams)
    exact = all(torch.equal(block_bytes(kv, n, blocks, d), ref[n][s]) for n in kv for (s, _), (d, _) in zip(out, into))
    others = [b for b in range(blocks) if b not in {d for d, _ in into}]
    clean = all(not block_bytes(kv, n, blocks, b).any() for n in kv for b in others)
    return exact and clean and moved_ok


def check_ordering(c: Check, env: Env, rate: float) -> None:
    """no_host_sync, overlap_out/in, stall_measured."""
    layers, blocks, heads, head, bs = (28, 512, 16, 256, 16) if not env.dry else (4, 64, 2, 32, 16)
    kv, _ = make_kv(env, layers, blocks, heads, head, torch.bfloat16, bs, bs, "NHD")
    n = blocks // 2
    out = [(2 * i, i) for i in range(n)]
    streams = env.streams()
    copier = BlockCopier(kv, blocks, host_slots=n, streams=streams)

    def step(direction: str, busy_s: float, before_bind: bool = False) -> tuple[float, float]:
        """(host seconds in the copy calls, wall seconds of the whole step). The busy kernel is the forward
        pass (after bind), or work the copies must wait for (before bind: any host sync then blocks)."""
        env.sync(streams)
        if busy_s and before_bind:
            env.busy(streams, busy_s, rate)
        t0 = time.perf_counter()
        copier.begin_step(**{"swap_out" if direction == "out" else "swap_in": out})
        t1 = time.perf_counter()
        if busy_s and not before_bind:
            env.busy(streams, busy_s, rate)  # the forward pass, launched after bind
        t2 = time.perf_counter()
        copier.copy_out_all() if direction == "out" else copier.copy_in()
        calls = time.perf_counter() - t2 + (t1 - t0)
        copier.finish()
        env.sync(streams)
        return calls, time.perf_counter() - t0

    for d in ("out", "in"):
        step(d, 0.0)  # warm-up
    copy_s = {d: statistics.median(step(d, 0.0)[1] for _ in range(3)) for d in ("out", "in")}
    # no_host_sync: the copy calls return while a long kernel still runs on the compute stream.
    sleep_s = 0.3
    calls = max(step("out", sleep_s, before_bind=True)[0], step("in", sleep_s, before_bind=True)[0])
    if env.dry:
        fake_ok = True  # checked below with a fresh step: nothing may run inside the calls
        s2 = FakeStreams("side")
        cp2 = BlockCopier(kv, blocks, host_slots=n, streams=s2)
        cp2.begin_step(swap_out=out[:4], swap_in=[(d + 1, h) for d, h in out[4:8]])
        cp2.copy_out_all()
        cp2.copy_in()
        fake_ok = s2.ops_run() == 0
        cp2.finish()
        c.row("no_host_sync", calls < 0.25 * sleep_s and fake_ok, f"calls {calls * 1e3:.1f} ms, ops run in calls: "
              f"{'none' if fake_ok else 'some'}", f"copy calls return in < {0.25 * sleep_s * 1e3:.0f} ms beside a "
              f"{sleep_s * 1e3:.0f} ms kernel, running nothing")
    else:
        c.row("no_host_sync", calls < 0.25 * sleep_s, f"calls {calls * 1e3:.1f} ms",
              f"bind + copy calls (out, in) return in < {0.25 * sleep_s * 1e3:.0f} ms behind a {sleep_s * 1e3:.0f} ms kernel")
    for d in ("out", "in"):
        busy_s = max(copy_s[d], 0.05)
        _, both = step(d, busy_s)
        stall = copier.stats_ms
        lo, hi = max(busy_s, copy_s[d]), min(busy_s, copy_s[d])
        if env.dry:
            # Sequential on the CPU: the time is the sum. What the GPU's overlap needs is that the copies
            # do not depend on the forward pass: forcing the side stream must not run the compute op.
            s3 = FakeStreams("side")
            cp3 = BlockCopier(kv, blocks, host_slots=n, streams=s3)
            cp3.begin_step(**{"swap_out" if d == "out" else "swap_in": out})
            ran: list[bool] = []
            s3.on(s3.compute(), lambda: ran.append(True))  # the forward pass
            cp3.copy_out_all() if d == "out" else cp3.copy_in()
            s3.side.synchronize()
            ok = not ran
            c.row(f"overlap_{d}", ok, f"copies {'waited for' if ran else 'independent of'} the forward",
                  "copies wait on the bind event only (GPU: time ~ max, not sum)")
            cp3.finish()
            s3.drain()
        else:
            ok = both <= lo + OVERLAP_SLACK * hi
            c.row(f"overlap_{d}", ok, f"{both * 1e3:.0f} ms (kernel {busy_s * 1e3:.0f}, copies {copy_s[d] * 1e3:.0f})",
                  f"<= max + {OVERLAP_SLACK} x min = {(lo + OVERLAP_SLACK * hi) * 1e3:.0f} ms")
            if stall is not None:
                measured = max(0.0, stall[0] - stall[1]) / 1e3 if stall[1] is not None else 0.0
                excess = max(0.0, both - busy_s)
                c.row(f"stall_measured_{d}", abs(measured - excess) <= 0.2 * both + 0.005,
                      f"events {measured * 1e3:.1f} ms, wall excess {excess * 1e3:.1f} ms",
                      "the step's measured stall ~ its time beyond the kernel (within 20% of the step + 5 ms)")


def check_pinned_and_bandwidth(c: Check, env: Env) -> None:
    layers, blocks, heads, head, bs = (28, 256, 16, 256, 16) if not env.dry else (4, 64, 2, 32, 16)
    kv, _ = make_kv(env, layers, blocks, heads, head, torch.bfloat16, bs, bs, "NHD")
    slots = blocks // 2
    streams = env.streams()
    page = heads * bs * 2 * head * 2
    want = slots * layers * page
    before = 0 if env.dry else torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    copier = BlockCopier(kv, blocks, host_slots=slots, streams=streams)
    if env.dry:
        got = copier.host.numel()
        c.row("pinned_exact", got == want, f"host buffer {got} B at start", f"exactly {want} B, allocated in the constructor")
    else:
        # Through torch's allocator (a torch with the exact-size setting) its statistics grow by the
        # buffer; registered in place (an older torch) they grow only by the small index buffer.
        # Rounded up to a power of two, they grow by more.
        got = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0) - before
        exact = abs(got - want) <= HOST_STATS_TOLERANCE * want or got <= HOST_STATS_TOLERANCE * want
        how = "allocator" if got > HOST_STATS_TOLERANCE * want else "registered"
        c.row("pinned_exact", exact and copier.host.is_pinned() and copier.host.numel() == want,
              f"pinned {copier.host.numel() / 2**20:.1f} MiB ({how}, allocator +{got / 2**20:.1f} MiB)",
              f"{want / 2**20:.1f} MiB within {HOST_STATS_TOLERANCE:.0%}")
    # Scattered device blocks, slots in runs of 8 (a fragmented host buffer).
    out = [(3 * i % blocks, (i // 8) * 8 + (i * 5) % 8) for i in range(slots)]

    def timed_steps(n: int, direction: str) -> list[float]:
        """Wall time of `n` steps that copy every block of `out` out (or in), each to its barrier."""
        ts = []
        for _ in range(n):
            env.sync(streams)
            t0 = time.perf_counter()
            if direction == "out":
                copier.begin_step(swap_out=out)
                copier.copy_out_all()
            else:
                copier.begin_step(swap_in=out)
                copier.copy_in()
            copier.finish()
            env.sync(streams)
            ts.append(time.perf_counter() - t0)
        return ts

    times = timed_steps(10, "out")
    ok = times[0] <= 1.5 * times[-1] + 0.002
    c.row("first_copy", None if env.dry else ok, f"first {times[0] * 1e3:.1f} ms, tenth {times[-1] * 1e3:.1f} ms",
          "first <= 1.5 x tenth + 2 ms" + (" (GPU only: CPU memory is mapped at first write)" if env.dry else ""))
    moved = len(out) * layers * page
    eff_out = moved / statistics.median(times[1:])
    eff_in = moved / statistics.median(timed_steps(5, "in"))
    raw_out, raw_in = raw_bandwidth(env, moved)
    for d, eff, raw in (("out", eff_out, raw_out), ("in", eff_in, raw_in)):
        c.row(f"bandwidth_{d}", None if env.dry else eff >= BANDWIDTH_FRACTION * raw,
              f"{eff / 1e9:.1f} GB/s of raw {raw / 1e9:.1f} GB/s", f">= {BANDWIDTH_FRACTION} x raw pinned")


def raw_bandwidth(env: Env, nbytes: int) -> tuple[float, float]:
    dev = torch.empty(nbytes, dtype=torch.uint8, device=env.device)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=not env.dry)

    def timed(fn: Callable[[], Any]) -> float:
        ts = []
        for _ in range(5):
            if not env.dry:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if not env.dry:
                torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        return nbytes / statistics.median(ts)

    return timed(lambda: host.copy_(dev, non_blocking=True)), timed(lambda: dev.copy_(host, non_blocking=True))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU tensors and simulated streams (automatic without CUDA)")
    args = ap.parse_args(argv)
    dry = args.dry_run or not torch.cuda.is_available()
    c = Check(dry)
    t0 = time.perf_counter()
    rate = 0.0 if dry else sleep_rate()
    for prefer in ("compute", "side") if dry else ("compute",):
        env = Env(dry, prefer)
        before = len(c.rows)
        check_round_trips(c, env, rate)
        if dry:
            for r in c.rows[before:]:
                r["check"] += f" [{prefer} first]"
    env = Env(dry)
    check_ordering(c, env, rate)
    check_pinned_and_bandwidth(c, env)
    device = "dry run (CPU, FakeStreams)" if dry else torch.cuda.get_device_name(0)
    print(f"gpu_check: {device}, torch {torch.__version__}, {time.perf_counter() - t0:.1f} s")
    print(c.table())
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_check.json").write_text(json.dumps({"device": device, "rows": c.rows}, indent=2))
    if c.failed:
        print(f"FAILED: {', '.join(c.failed)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
