"""The benchmark's requests, from its own generator (`infercept.benchmarks.workload.generate`).

A replay is exact when the generator is given what the benchmark gave it: the mixed and chatbot
workloads draw real ShareGPT prompts, tokenized by the benchmark model's tokenizer, and the random
draws those take shape every later request. With the ShareGPT package and the model's tokenizer
folder present (prepared by `infercept model prepare`, never built here), the simulator passes them
too and replays exactly the benchmark's requests; otherwise it generates without them, which is the
same workload distribution but other draws (the result says which)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

from infercept.benchmarks.workload import Request, ShareGPT, generate


@functools.lru_cache(maxsize=2)
def _tokenizer_encode(model: str) -> Any:
    from engine_adapter.models import model_dir

    folder = model_dir(model)
    if not (folder / "tokenizer.json").is_file():
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return None
    tok = AutoTokenizer.from_pretrained(str(folder))
    return lambda t: tok.encode(t, add_special_tokens=False)


@functools.lru_cache(maxsize=1)
def _sharegpt_texts() -> tuple[str, ...]:
    return tuple(ShareGPT().texts) if ShareGPT.available() else ()


def bench_workloads(workload: str, rates: Sequence[float], duration_s: float, seed: int, *, context_scale: float = 1.0,
                    max_context: int = 3500, sharegpt_model: str | None = None) -> tuple[dict[float, list[Request]], str]:
    """(requests per rate, how exact the replay is). `sharegpt_model`: the benchmark's model, whose
    tokenizer encoded the ShareGPT prompts (None: the benchmark used none). Memoized (a validation's
    fit replays the same workloads many times; callers copy what they change)."""
    return _bench_workloads(workload, tuple(rates), duration_s, seed, context_scale, max_context, sharegpt_model)


@functools.lru_cache(maxsize=4)
def _bench_workloads(workload: str, rates: tuple[float, ...], duration_s: float, seed: int, context_scale: float,
                     max_context: int, sharegpt_model: str | None) -> tuple[dict[float, list[Request]], str]:
    encode, texts, note = None, (), "synthetic prompts (as the benchmark without ShareGPT)"
    if sharegpt_model and workload in ("mixed", "chatbot"):
        texts = _sharegpt_texts()
        encode = _tokenizer_encode(sharegpt_model) if texts else None
        if encode is None or not texts:
            missing = "the ShareGPT package (scripts/install.sh)" if not texts else \
                f"{sharegpt_model}'s tokenizer (`infercept model prepare --name {sharegpt_model}`)"
            texts, note = (), f"approximate: {missing} is missing, other draws than the benchmark's"
        else:
            note = f"exact: ShareGPT prompts tokenized with {sharegpt_model}'s tokenizer, as the benchmark drew them"
    out = {r: [lengths_only(q) for q in generate(workload, r, duration_s, seed, context_scale=context_scale,
                                                 max_context=max_context, encode=encode, sharegpt=list(texts) if texts else None)]
           for r in rates}
    return out, note


def lengths_only(req: Request) -> Request:
    """The simulator reads a prompt's length only: a `range` of it stands in for its token ids (a
    paper-scale sweep's prompts would otherwise hold hundreds of MB of ints)."""
    return dataclasses.replace(req, prompt=range(len(req.prompt)))  # type: ignore[arg-type]
