"""Assemble an intercept core from the engine's configuration: the policy spec, the performance profile
(measured file, or defaults; an emulated swap link replaces its bandwidth), the duration estimator and
the swap planner. Shared by the vLLM scheduler and the simulator."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from engine_adapter.config import CoreConfig
from engine_adapter.intercept.core import CoreSettings, InterceptCore
from engine_adapter.intercept.state import KvPort
from engine_adapter.intercept.swap import SwapPlanner
from engine_adapter.policy.estimator import DurationEstimator, load_priors
from engine_adapter.paths import require_file, shipped_config
from engine_adapter.policy.profile import Profile, default_profile, find_profile
from engine_adapter.policy.table import policy_spec

log = logging.getLogger("vllm.infercept.core")  # under vLLM's logger tree in the engine core


def load_profile(cfg: CoreConfig, model: str, device: str, kv_bytes_per_token: int) -> Profile:
    """The profile the waste equations and swap budgets use; M is always the engine's real KV size."""
    if cfg.profile:
        path: Path | None = require_file(cfg.profile, "engine.profile")
    else:
        path, searched = find_profile(model, device)
    if path is not None:
        loaded = Profile.load(path)
        prof = dataclasses.replace(loaded, kv_bytes_per_token=kv_bytes_per_token, source=f"{loaded.source}: {path}")
    else:
        prof = default_profile(model, device, kv_bytes_per_token, f"no measured profile ({' or '.join(map(str, searched))})")
        log.warning("InferCept core: %s; using built-in defaults (measure one with `infercept profile`)", prof.source)
    if cfg.saturation_tokens is not None:
        prof = dataclasses.replace(prof, saturation_tokens=cfg.saturation_tokens,
                                   source=f"{prof.source}; S set to {cfg.saturation_tokens} by the configuration")
    if cfg.swap_link_gbps:
        # Swaps go over an emulated link: budgets and stall accounting use its bandwidth, and copies
        # overlap the forward pass as on a GPU's side stream.
        link = cfg.swap_link_gbps * 1e9
        prof = dataclasses.replace(prof, swap_out_bytes_per_s=link, swap_in_bytes_per_s=link, device=f"{prof.device}+link",
                                   source=f"{prof.source}; emulated link {cfg.swap_link_gbps} GB/s")
    return prof


def build_core(cfg: CoreConfig, kv: KvPort, *, model: str, device: str, block_size: int, kv_bytes_per_token: int,
               host_slots: int, release_when_copied: bool = True) -> InterceptCore:
    spec = policy_spec(cfg.policy)
    prof = load_profile(cfg, model, device, kv_bytes_per_token)
    priors_path = require_file(cfg.augmentation_priors, "engine.augmentation_priors") if cfg.augmentation_priors \
        else shipped_config("augmentations.yaml")
    priors = load_priors(str(priors_path))
    estimator = DurationEstimator(spec.estimator or cfg.estimator, priors)
    swap = SwapPlanner(prof, block_size, host_slots) if spec.swap else None
    settings = CoreSettings(ttl_s=dict(cfg.ttl_s), demotion_reserve_blocks=cfg.demotion_reserve_blocks,
                            new_first_max_steps=cfg.new_first_max_steps, prefetch_min_p=cfg.prefetch_min_p,
                            release_when_copied=release_when_copied)
    log.info("InferCept core: policy=%s profile=%s (S=%d tokens, M=%d B/token) estimator=%s host_slots=%s",
             spec.name, prof.source, prof.saturation_tokens, prof.kv_bytes_per_token, estimator.mode,
             host_slots if swap else "-")
    return InterceptCore(spec, kv, block_size=block_size, profile=prof, estimator=estimator, settings=settings, swap=swap)
