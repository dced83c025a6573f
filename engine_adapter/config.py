"""Engine configuration: one frozen dataclass, validated once, and the slice of it that travels to the
engine core (a child process) inside vLLM's `additional_config`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_adapter.paths import require_file
from engine_adapter.policy.estimator import ESTIMATORS
from engine_adapter.policy.table import DEFAULT_TTL_S, policy_spec
from engine_adapter.triggers import DEFAULT_TRIGGERS, Trigger

ADDITIONAL_CONFIG_KEY = "infercept"


@dataclass(frozen=True)
class EngineConfig:
    model: str = "default"  # "default" | "tiny" | a local HF folder | a hub id
    policy: str = "preserve"
    # "auto": bfloat16 on a GPU or on a CPU with native bf16 (AVX-512 BF16 or AMX), else float32
    # (a CPU without it runs bf16 matmuls many times slower than float32: measured 46x on AVX2).
    dtype: str = "auto"
    kv_cache_gib: float = 1.0  # VLLM_CPU_KVCACHE_SPACE on CPU; fraction-free sizing on GPU
    num_kv_blocks: int | None = None  # overrides the KV size (tests use a small cache)
    block_size: int | None = None  # None: vLLM's default for the platform (128 on CPU)
    max_num_seqs: int = 64
    max_model_len: int = 4096
    max_num_batched_tokens: int | None = None
    seed: int = 0
    triggers: tuple[Trigger, ...] = DEFAULT_TRIGGERS
    trigger_window_tokens: int = 96
    ttl_s: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_TTL_S))
    # Augmentation type of a turn that ends without a trigger (EOS, max_tokens): waiting for the human.
    turn_end_type: str = "chat"
    # Free blocks kept in reserve beyond the next step's need before preserved KV is demoted.
    demotion_reserve_blocks: int = 0
    # Policies that admit new requests ahead of a resumed request that does not fit (infercept-admit): how
    # many steps in a row one such request may be passed over before it is first in line again.
    new_first_max_steps: int = 128
    # Policies that prefetch (infercept-prefetch): a swapped context is copied back once its call is at least
    # this likely to be over by the time the copy is (from the type's duration distribution, learned online).
    prefetch_min_p: float = 0.5
    # Swap (policies `swap` and `infercept`; `vllm-offload`'s host tier takes the same size and link): host
    # buffer size, and the performance profile the waste equations and swap budgets use (None:
    # <model>-<device>.json measured on this machine in $INFERCEPT_HOME/profiles or shipped in
    # infercept.configs/profiles, else built-in defaults, which the engine logs as the profile's source; a
    # path given here must exist).
    swap_space_gib: float = 1.0
    # Emulated device<->host link (GB/s) for swaps, for experiments on machines whose copies are far
    # cheaper than a GPU's PCIe link (RAM to RAM here): each iteration's copies take at least
    # bytes / link, overlapped with that iteration's forward pass (what outlasts it stalls), and the
    # policy's swap budgets use the link's bandwidth. None: the real copies, unthrottled.
    swap_link_gbps: float | None = None
    profile: str | None = None
    # S as the core uses it instead of the profile's: the cap on chunking policies' iterations and the chunk
    # of Eq. 4's recompute (None: the profile's measured S; the benchmark's budget pilot sets it).
    saturation_tokens: int | None = None
    # Call-duration estimate for `infercept`: prior (type distribution, default) | dynamic | oracle.
    estimator: str = "prior"
    augmentation_priors: str | None = None  # YAML with the Table 1 priors (None: the shipped augmentations.yaml)
    # vLLM's own statistics: its Prometheus metrics (the `vllm:` families: running and waiting requests,
    # KV-cache usage, time to first token, inter-token latency) in the process's default registry.
    log_stats: bool = False
    # Scale-out through vLLM's own executors (multiprocessing on one machine, Ray across machines):
    # every engine core runs the intercept scheduler and the swap connector. With data parallelism
    # each session is pinned to one rank for its lifetime (its KV stays where it is).
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    distributed_executor_backend: str | None = None  # None: vLLM's choice ("mp" on one machine) | "mp" | "ray"
    # CUDA graphs: None (auto) captures them on a GPU (piecewise with the swap connector, which keeps its
    # per-layer hooks between the pieces) and runs eagerly on a CPU (vLLM's CPU backend has none).
    enforce_eager: bool | None = None

    def __post_init__(self) -> None:
        policy_spec(self.policy)  # raises for an unknown name, listing the known ones
        if self.dtype not in ("bfloat16", "float16", "float32", "auto"):
            raise ValueError(f"unsupported dtype {self.dtype!r}")
        if self.kv_cache_gib <= 0 or not math.isfinite(self.kv_cache_gib):
            raise ValueError("kv_cache_gib must be a positive number")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError("num_kv_blocks must be at least 2")
        if self.saturation_tokens is not None and self.saturation_tokens < 1:
            raise ValueError("saturation_tokens must be a positive number of tokens")
        if self.max_num_seqs < 1 or self.max_model_len < 16:
            raise ValueError("max_num_seqs must be >= 1 and max_model_len >= 16")
        names = [t.name for t in self.triggers]
        if len(set(names)) != len(names):
            raise ValueError(f"trigger names must be unique: {names}")
        if self.swap_link_gbps is not None and not (self.swap_link_gbps > 0 and math.isfinite(self.swap_link_gbps)):
            raise ValueError("swap_link_gbps must be a positive number of GB/s")
        if self.swap_space_gib < 0:
            raise ValueError("swap_space_gib must be >= 0")
        if not 0 < self.prefetch_min_p <= 1:
            raise ValueError("prefetch_min_p must be a probability in (0, 1]")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {self.estimator!r}; choose one of {', '.join(ESTIMATORS)}")
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(f"{name} must be an integer >= 1")
        if self.distributed_executor_backend not in (None, "mp", "ray", "uni", "external_launcher"):
            raise ValueError("distributed_executor_backend must be one of mp, ray, uni, external_launcher")
        for k, v in self.ttl_s.items():
            if v < 0:
                raise ValueError(f"ttl for {k!r} must be >= 0")
        # A file named here but missing is an error now, in the caller's process, not a silent fall back to
        # defaults in the engine core.
        if self.profile is not None:
            require_file(self.profile, "engine.profile")
        if self.augmentation_priors is not None:
            require_file(self.augmentation_priors, "engine.augmentation_priors")

    @property
    def prefix_caching(self) -> bool:
        # Only the policy modelling today's vLLM keeps freed blocks hittable; every other policy
        # must really recompute what it discards, or the comparison would flatter discarding.
        return policy_spec(self.policy).prefix_caching

    def resolved_dtype(self) -> str:
        return resolve_dtype(self.dtype)

    def resolved_enforce_eager(self, cuda: bool | None = None) -> bool:
        """Eager on a CPU, CUDA graphs on a GPU, unless `enforce_eager` says otherwise."""
        if self.enforce_eager is not None:
            return self.enforce_eager
        return not (_cuda_available() if cuda is None else cuda)

    def core_config(self) -> dict[str, Any]:
        """The JSON-able part the scheduler in the engine core needs."""
        return {
            "policy": self.policy,
            "triggers": [t.to_dict() for t in self.triggers],
            "trigger_window_tokens": self.trigger_window_tokens,
            "ttl_s": dict(self.ttl_s),
            "turn_end_type": self.turn_end_type,
            "demotion_reserve_blocks": self.demotion_reserve_blocks,
            "new_first_max_steps": self.new_first_max_steps,
            "prefetch_min_p": self.prefetch_min_p,
            "profile": self.profile,
            "saturation_tokens": self.saturation_tokens,
            "swap_link_gbps": self.swap_link_gbps,
            "estimator": self.estimator,
            "augmentation_priors": self.augmentation_priors,
        }


def host_chunks(swap_space_bytes: int, kv_bytes_per_block: int) -> int:
    """Whole blocks of KV that fit in the host buffer: the `swap` policies' host slots, the host tier's
    blocks, and the simulator's of both."""
    return max(0, swap_space_bytes // max(1, kv_bytes_per_block))


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bfloat16 natively (AVX-512 BF16 or AMX-BF16), from /proc/cpuinfo."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = set(cpuinfo.split())
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def _cuda_available() -> bool:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def resolve_dtype(dtype: str, cuda: bool | None = None) -> str:
    """The dtype to serve with: `auto` is bfloat16 on a GPU or a bf16-capable CPU, else float32."""
    if dtype != "auto":
        return dtype
    if cuda is None:
        cuda = _cuda_available()
    return "bfloat16" if cuda or cpu_has_native_bf16() else "float32"


@dataclass(frozen=True)
class CoreConfig:
    """`EngineConfig.core_config()` as read back in the engine core."""

    policy: str
    triggers: tuple[Trigger, ...]
    trigger_window_tokens: int
    ttl_s: dict[str, float]
    turn_end_type: str
    demotion_reserve_blocks: int
    new_first_max_steps: int = 128
    prefetch_min_p: float = 0.5
    profile: str | None = None
    estimator: str = "prior"
    augmentation_priors: str | None = None
    swap_link_gbps: float | None = None
    saturation_tokens: int | None = None

    @classmethod
    def from_additional_config(cls, additional: Mapping[str, Any] | None) -> CoreConfig:
        d = dict((additional or {}).get(ADDITIONAL_CONFIG_KEY) or EngineConfig().core_config())
        return cls(
            policy=d["policy"],
            triggers=tuple(Trigger.from_dict(t) for t in d["triggers"]),
            trigger_window_tokens=int(d["trigger_window_tokens"]),
            ttl_s={str(k): float(v) for k, v in d["ttl_s"].items()},
            turn_end_type=str(d["turn_end_type"]),
            demotion_reserve_blocks=int(d["demotion_reserve_blocks"]),
            new_first_max_steps=int(d.get("new_first_max_steps", 128)),
            prefetch_min_p=float(d.get("prefetch_min_p", 0.5)),
            profile=d.get("profile"),
            estimator=str(d.get("estimator", "prior")),
            augmentation_priors=d.get("augmentation_priors"),
            swap_link_gbps=d.get("swap_link_gbps"),
            saturation_tokens=d.get("saturation_tokens"),
        )


def _trigger_from_yaml(item: Any) -> Trigger:
    if isinstance(item, str):
        builtin = {t.name: t for t in DEFAULT_TRIGGERS}
        if item not in builtin:
            raise ValueError(f"unknown built-in trigger {item!r}; built-ins: {', '.join(builtin)}")
        return builtin[item]
    if isinstance(item, Mapping) and {"name", "pattern", "end_chars"} <= set(item):
        return Trigger.from_dict(dict(item))
    raise ValueError(f"a trigger is a built-in name or {{name, pattern, end_chars}}, got {item!r}")


def read_config_doc(path: str | None) -> Mapping[str, Any]:
    """The top-level mapping of a YAML config file (empty without a path); shared by the engine's
    and the gateway's loaders."""
    import yaml

    if path is None:
        return {}
    with open(require_file(path, "config file")) as f:
        doc = yaml.safe_load(f) or {}
    if not isinstance(doc, Mapping):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return doc


def load_engine_config(path: str | None, **overrides: Any) -> EngineConfig:
    """Read the `engine:` section of a YAML config (unknown keys are errors), then apply overrides
    (command-line flags; None values are ignored)."""
    import dataclasses

    data: dict[str, Any] = dict(read_config_doc(path).get("engine") or {})
    data.update({k: v for k, v in overrides.items() if v is not None})
    known = {f.name for f in dataclasses.fields(EngineConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown engine setting(s): {', '.join(unknown)}")
    if "triggers" in data:
        data["triggers"] = tuple(_trigger_from_yaml(t) for t in data["triggers"])
    if "ttl_s" in data:
        data["ttl_s"] = {str(k): float(v) for k, v in dict(data["ttl_s"]).items()}
    try:
        return EngineConfig(**data)
    except TypeError as e:
        raise ValueError(f"bad engine config: {e}") from e
