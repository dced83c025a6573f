"""How long will a paused request's call still last? (T_INT in Eq. 2.)

* `dynamic`: the paper's estimate, remaining = t_now - t_call (the longer a call has run, the longer
  it is expected to run).
* `prior` (default): the augmentation type's duration distribution: a log-normal prior matching the
  mean and spread of the paper's Table 1, updated online with the durations observed on this engine.
  The estimate is the mean residual life E[T - t | T > t] over that distribution (pseudo-samples of the
  prior plus observed samples), so a short-call type stays cheap to preserve while it is on time, and
  a call that outlives every sample falls back to the dynamic estimate.
* `oracle`: the caller passed the true duration (benchmarks); remaining = true - elapsed.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import NormalDist

ESTIMATORS = ("dynamic", "prior", "oracle")


def lognormal_quantiles(mean: float, std: float, k: int) -> list[float]:
    """k evenly spaced quantiles of the log-normal with this mean and standard deviation."""
    if mean <= 0:
        return [0.0] * k
    sigma2 = math.log(1 + (std / mean) ** 2)
    mu = math.log(mean) - sigma2 / 2
    nd = NormalDist(mu, math.sqrt(sigma2)) if sigma2 > 0 else None
    if nd is None:
        return [mean] * k
    return [math.exp(nd.inv_cdf((i + 0.5) / k)) for i in range(k)]


@dataclass
class TypeStats:
    prior: list[float]
    observed: deque[float] = field(default_factory=lambda: deque(maxlen=256))
    _sorted: list[float] | None = None  # the samples in order, until the next observation
    _mean: float | None = None  # their mean, likewise
    _tail_sums: list[float] | None = None  # _tail_sums[i] = sum(ordered()[i:]), likewise

    def samples(self) -> list[float]:
        # Observed durations outweigh the prior as they accumulate (the prior is 32 pseudo-samples).
        return self.prior + list(self.observed)

    def observe(self, duration_s: float) -> None:
        self.observed.append(duration_s)
        self._sorted = self._mean = self._tail_sums = None

    def mean(self) -> float:
        if self._mean is None:
            s = self.samples()
            self._mean = sum(s) / len(s)
        return self._mean

    def ordered(self) -> list[float]:
        if self._sorted is None:
            self._sorted = sorted(self.samples())
        return self._sorted

    def mean_residual(self, elapsed_s: float) -> float | None:
        """E[T - t | T > t] over the samples (None when none is longer than t). Asked for every paused
        request in every step, so from the ordered samples and their tail sums, not a pass over all."""
        xs = self.ordered()
        if self._tail_sums is None:
            sums = [0.0] * (len(xs) + 1)
            for i in range(len(xs) - 1, -1, -1):
                sums[i] = sums[i + 1] + xs[i]
            self._tail_sums = sums
        first = bisect.bisect_right(xs, elapsed_s)
        if first == len(xs):
            return None
        return self._tail_sums[first] / (len(xs) - first) - elapsed_s


@dataclass
class DurationEstimator:
    mode: str = "prior"
    priors: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # type -> (mean, std) s
    prior_samples: int = 32
    default_prior: tuple[float, float] = (1.0, 1.0)
    _types: dict[str, TypeStats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in ESTIMATORS:
            raise ValueError(f"unknown estimator {self.mode!r}; choose one of {', '.join(ESTIMATORS)}")

    def _stats(self, aug_type: str) -> TypeStats:
        st = self._types.get(aug_type)
        if st is None:
            mean, std = self.priors.get(aug_type, self.default_prior)
            st = TypeStats(lognormal_quantiles(mean, std, self.prior_samples))
            self._types[aug_type] = st
        return st

    def observe(self, aug_type: str, duration_s: float) -> None:
        if duration_s >= 0 and math.isfinite(duration_s):
            self._stats(aug_type).observe(duration_s)

    def remaining_s(self, aug_type: str, elapsed_s: float, true_duration_s: float | None = None) -> float:
        elapsed_s = max(0.0, elapsed_s)
        if self.mode == "oracle" and true_duration_s is not None:
            return max(0.0, true_duration_s - elapsed_s)
        if self.mode == "dynamic" or self.mode == "oracle":
            return elapsed_s
        residual = self._stats(aug_type).mean_residual(elapsed_s)
        return elapsed_s if residual is None else max(0.0, residual)

    def back_within_p(self, aug_type: str, elapsed_s: float, horizon_s: float,
                      true_duration_s: float | None = None) -> float:
        """The probability that a call which has lasted `elapsed_s` ends within `horizon_s` from now, over
        the type's distribution (when to fetch a swapped context back ahead of its return). The
        estimates without a distribution (`dynamic`, `oracle`, a call that outlived every sample) answer
        0 or 1: whether `remaining_s` falls within the horizon."""
        elapsed_s = max(0.0, elapsed_s)
        if self.mode == "prior":
            xs = self._stats(aug_type).ordered()  # asked every step for every swapped context: bisect
            first = bisect.bisect_right(xs, elapsed_s)
            if first < len(xs):
                return (bisect.bisect_right(xs, elapsed_s + horizon_s) - first) / (len(xs) - first)
        return 1.0 if self.remaining_s(aug_type, elapsed_s, true_duration_s) <= horizon_s else 0.0

    def samples(self, aug_type: str) -> list[float]:
        """The type's duration distribution as samples: the prior's pseudo-samples and what was observed."""
        return self._stats(aug_type).samples()

    def mean_s(self, aug_type: str) -> float:
        return self._stats(aug_type).mean()


def load_priors(path: str) -> dict[str, tuple[float, float]]:
    import yaml

    with open(path) as f:
        doc = yaml.safe_load(f) or {}
    out: dict[str, tuple[float, float]] = {}
    for name, spec in (doc.get("types") or {}).items():
        mean, std = spec["duration_s"]
        if mean < 0 or std < 0:
            raise ValueError(f"{path}: {name}: duration mean and spread must be >= 0")
        out[str(name)] = (float(mean), float(std))
    return out
