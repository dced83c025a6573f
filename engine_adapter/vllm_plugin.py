"""vLLM general plugin (entry point group `vllm.general_plugins`, see pyproject.toml): vLLM loads it in
every process it starts (API process, engine core, workers), before any model runner exists.

What it fixes: seeded sampling on vLLM's CPU backend kills the engine core. After a step whose sampled
token is thrown away (a partial prefill: a prompt longer than the token budget, or a context recomputed
in chunks after InferCept discarded it), vLLM's model runner rewinds that request's own generator with
`gen.set_offset(gen.get_offset() - 4)`, a detail of CUDA's Philox generator. A CPU generator has no
offset and raises "CPU Generator does not use offset"; the worker's exception ends the engine core, and
every session on the server with it. Any client that sends `seed` with a temperature and a long enough
message triggers it (the schemathesis phase of `infercept loadtest` did).

On CPU the plugin does what the rewind means, exactly: it saves the state of the generators of the
requests whose token will be discarded before the sampler draws, puts it back after, and hides those
generators from the offset rewind. A seeded request then draws the same stream however its prompt is
chunked. CUDA (Philox) generators are left to vLLM's own rewind.

vLLM 0.32 internals relied on: the model runner's `_sample` and `_bookkeeping_sync` (read and replaced
through the port, `vllm_port.runner_sampling` / `set_runner_sampling`), `input_batch.{num_reqs,
generators}` and `discard_request_mask`.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

_PATCHED = "_infercept_cpu_seed_fix"


def register() -> None:
    """The entry point vLLM calls in each of its processes."""
    try:
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner
    except ImportError:  # a vLLM build without the CPU runner: nothing to fix
        return
    patch_cpu_runner(CPUModelRunner)


def discarded_cpu_generators(runner: Any) -> dict[int, torch.Generator]:
    """Batch index -> generator, for this step's requests whose sampled token is discarded and whose
    generator is a CPU one (the model runner's `discard_request_mask`, set when the step's inputs were
    prepared)."""
    n = runner.input_batch.num_reqs
    gens: dict[int, torch.Generator] = runner.input_batch.generators
    if not gens or n == 0:
        return {}
    out = {}
    for i in np.nonzero(runner.discard_request_mask.np[:n])[0]:
        g = gens.get(int(i))
        if g is not None and g.device.type == "cpu":
            out[int(i)] = g
    return out


def patch_cpu_runner(cls: type) -> None:
    if getattr(cls, _PATCHED, False):
        return
    from engine_adapter.vllm_port import runner_sampling, set_runner_sampling

    orig_sample, orig_bookkeeping = runner_sampling(cls)

    def _sample(self: Any, logits: Any, spec_decode_metadata: Any) -> Any:
        saved = [(g, g.get_state()) for g in discarded_cpu_generators(self).values()]
        out = orig_sample(self, logits, spec_decode_metadata)
        for g, state in saved:
            g.set_state(state)  # as if the discarded token had not been sampled
        return out

    def _bookkeeping_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        hidden = discarded_cpu_generators(self)  # already rewound in _sample; no offset to rewind
        gens = self.input_batch.generators
        for i in hidden:
            del gens[i]
        try:
            return orig_bookkeeping(self, *args, **kwargs)
        finally:
            gens.update(hidden)

    set_runner_sampling(cls, _sample, _bookkeeping_sync)
    setattr(cls, _PATCHED, True)
