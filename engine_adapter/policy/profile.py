"""The performance model the waste equations need: T_fwd over batched tokens, the GPU saturation point
S, KV bytes per token M, and swap bandwidth. Loaded from a JSON profile (`infercept profile` writes one)
or built from defaults. Pure: no torch, no vLLM."""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Profile:
    model: str
    device: str
    # T_fwd: measured forward time (seconds) of one iteration that schedules `tokens` query tokens.
    fwd_tokens: tuple[int, ...]
    fwd_seconds: tuple[float, ...]
    saturation_tokens: int  # S: past it, time per token stops falling
    kv_bytes_per_token: int  # M
    swap_out_bytes_per_s: float
    swap_in_bytes_per_s: float
    source: str = "measured"  # or "defaults: <why>"
    extra: Mapping[str, Any] = field(default_factory=dict)
    # Online refinement (beyond the paper): observed/predicted iteration-time ratio per grid point,
    # learned from the iterations the engine really runs. Mutable contents, not part of equality.
    _ratios: dict[int, float] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.fwd_tokens) != len(self.fwd_seconds) or not self.fwd_tokens:
            raise ValueError("profile: fwd_tokens and fwd_seconds must be non-empty and of equal length")
        if list(self.fwd_tokens) != sorted(set(self.fwd_tokens)) or self.fwd_tokens[0] < 1:
            raise ValueError("profile: fwd_tokens must be strictly increasing positive integers")
        if any(t <= 0 for t in self.fwd_seconds):
            raise ValueError("profile: forward times must be positive")
        if self.kv_bytes_per_token <= 0 or self.swap_out_bytes_per_s <= 0 or self.swap_in_bytes_per_s <= 0:
            raise ValueError("profile: M and swap bandwidths must be positive")
        if self.saturation_tokens < 1:
            raise ValueError("profile: saturation point must be >= 1 token")

    def _bucket(self, tokens: float) -> int:
        """The grid point nearest `tokens` on a log scale (ties to the smaller). Asked for every paused
        request in every step's decisions, so no logs: t is nearer x0 than x1 exactly when t^2 <= x0 x1."""
        xs = self.fwd_tokens
        i = bisect.bisect_left(xs, tokens)
        if i == 0:
            return xs[0]
        if i == len(xs):
            return xs[-1]
        x0, x1 = xs[i - 1], xs[i]
        return x0 if tokens * tokens <= x0 * x1 else x1

    def observe(self, tokens: int, seconds: float, weight: float = 0.05) -> None:
        """Fold one measured iteration (tokens scheduled, wall seconds) into the refinement."""
        if tokens <= 0 or not (0 < seconds < 60):
            return
        predicted = self._t_fwd_base(tokens)
        b = self._bucket(tokens)
        old = self._ratios.get(b, 1.0)
        self._ratios[b] = (1 - weight) * old + weight * (seconds / predicted)

    def refinement(self) -> dict[int, float]:
        """Observed / predicted iteration time per grid point (1.0 where nothing was observed)."""
        return dict(self._ratios)

    def t_fwd_s(self, tokens: float) -> float:
        """Forward time of an iteration with `tokens` query tokens: linear between measured points,
        extrapolated linearly past the last one (and proportionally below the first), scaled by what
        the engine has observed near that size."""
        if tokens <= 0:
            return 0.0
        return self._t_fwd_base(tokens) * self._ratios.get(self._bucket(tokens), 1.0)

    def _t_fwd_base(self, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        xs, ys = self.fwd_tokens, self.fwd_seconds
        if tokens <= xs[0]:
            return ys[0] * tokens / xs[0] if len(xs) == 1 else ys[0]
        if len(xs) == 1:
            return ys[0] * tokens / xs[0]
        i = bisect.bisect_left(xs, tokens)
        if i >= len(xs):
            i = len(xs) - 1
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)

    def t_swap_out_s(self, tokens: float) -> float:
        return tokens * self.kv_bytes_per_token / self.swap_out_bytes_per_s

    def t_swap_in_s(self, tokens: float) -> float:
        return tokens * self.kv_bytes_per_token / self.swap_in_bytes_per_s

    def to_json(self) -> str:
        d = asdict(self)
        d.pop("_ratios", None)
        d["fwd_tokens"], d["fwd_seconds"] = list(self.fwd_tokens), list(self.fwd_seconds)
        d["extra"] = dict(self.extra)
        return json.dumps(d, indent=2)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Profile:
        return cls(
            model=str(d["model"]),
            device=str(d["device"]),
            fwd_tokens=tuple(int(x) for x in d["fwd_tokens"]),
            fwd_seconds=tuple(float(x) for x in d["fwd_seconds"]),
            saturation_tokens=int(d["saturation_tokens"]),
            kv_bytes_per_token=int(d["kv_bytes_per_token"]),
            swap_out_bytes_per_s=float(d["swap_out_bytes_per_s"]),
            swap_in_bytes_per_s=float(d["swap_in_bytes_per_s"]),
            source=str(d.get("source", "measured")),
            extra=dict(d.get("extra") or {}),
        )

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        return cls.from_dict(json.loads(Path(path).read_text()))


def saturation_point(tokens: Sequence[int], seconds: Sequence[float], tolerance: float = 0.05) -> int:
    """S: the smallest measured token count whose time per token is within `tolerance` of the best
    (lowest) time per token seen. Past it, batching more tokens buys (almost) no throughput."""
    per_token = [s / t for t, s in zip(tokens, seconds)]
    best = min(per_token)
    for t, p in zip(tokens, per_token):
        if p <= best * (1 + tolerance):
            return int(t)
    return int(tokens[-1])  # pragma: no cover - the minimum always qualifies


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_size: int, dtype_bytes: int) -> int:
    """M for a standard attention model: K and V for every layer."""
    return 2 * num_layers * num_kv_heads * head_size * dtype_bytes


def chunks_needed(context_tokens: int, chunk_tokens: int) -> int:
    return max(1, math.ceil(context_tokens / max(1, chunk_tokens)))


# Measured on a 2-core CPU machine with SmolLM2-135M bf16 (shared/NOTES.md): used when no profile file
# matches. The engine replaces M with its real KV size and says that these are defaults.
_CPU_DEFAULT_FWD = ((64, 256, 512, 1024, 2048), (0.073, 0.201, 0.396, 0.907, 3.057))


def default_profile(model: str, device: str, kv_bytes_per_token: int, reason: str) -> Profile:
    tokens, seconds = _CPU_DEFAULT_FWD
    return Profile(
        model=model,
        device=device,
        fwd_tokens=tokens,
        fwd_seconds=seconds,
        saturation_tokens=saturation_point(tokens, seconds),
        kv_bytes_per_token=kv_bytes_per_token,
        swap_out_bytes_per_s=5e9,
        swap_in_bytes_per_s=5e9,
        source=f"defaults: {reason}",
    )


def profile_path(profiles_dir: Path, model: str, device: str) -> Path:
    """<profiles_dir>/<model folder name>-<device>.json"""
    return profiles_dir / f"{Path(model).name}-{device}.json"


def find_profile(model: str, device: str) -> tuple[Path | None, list[Path]]:
    """The measured profile for this model and device: one made on this machine (`infercept profile`,
    in $INFERCEPT_HOME/profiles) wins over the one shipped in the package. Returns (path or None, the
    paths searched)."""
    from engine_adapter.paths import configs_dir, user_profiles_dir

    searched = [profile_path(user_profiles_dir(), model, device), profile_path(configs_dir() / "profiles", model, device)]
    return next((p for p in searched if p.is_file()), None), searched
