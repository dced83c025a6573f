from __future__ import annotations

from pathlib import Path

import pytest

from engine_adapter.config import CoreConfig, EngineConfig, load_engine_config
from engine_adapter.triggers import REACT

REPO = Path(__file__).resolve().parents[2]


def test_shipped_config_loads_and_round_trips_to_the_core() -> None:
    cfg = load_engine_config(str(REPO / "configs" / "default.yaml"), policy="ttl", model=None)
    assert cfg.policy == "ttl" and cfg.model == "default"  # flag wins, None is ignored
    assert [t.name for t in cfg.triggers] == ["react", "tool_call", "observation"]
    assert cfg.ttl_s["image"] == 0.0
    core = CoreConfig.from_additional_config({"infercept": cfg.core_config()})
    assert core.policy == "ttl" and core.triggers[0] == REACT and core.ttl_s == dict(cfg.ttl_s)


def test_prefix_caching_only_for_vllm_apc() -> None:
    assert [EngineConfig(policy=p).prefix_caching for p in ("discard", "vllm-apc", "preserve")] == [False, True, False]


@pytest.mark.parametrize(
    "yaml_text, message",
    [
        ("engine: {policy: lru}", "unknown policy"),
        ("engine: {kv_cache: 3}", "unknown engine setting"),
        ("engine: {triggers: [smoke]}", "unknown built-in trigger"),
        ("engine: {triggers: [{name: x, pattern: '(', end_chars: ')'}]}", "bad pattern"),
        ("engine: {ttl_s: {math: -1}}", "must be >= 0"),
        ("engine: {max_num_seqs: 0}", "max_num_seqs"),
        ("- a list", "mapping"),
    ],
)
def test_bad_configs_are_rejected_clearly(tmp_path: Path, yaml_text: str, message: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(yaml_text)
    with pytest.raises(ValueError, match=message):
        load_engine_config(str(f))


def test_custom_trigger_from_yaml(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("engine:\n  triggers:\n    - {name: call, pattern: 'CALL\\((?P<tool>\\w+)\\)', end_chars: ')'}\n")
    cfg = load_engine_config(str(f))
    assert cfg.triggers[0].regex.search("CALL(search)").group("tool") == "search"


def test_auto_dtype_is_bf16_only_where_it_is_native() -> None:
    from engine_adapter.config import cpu_has_native_bf16, resolve_dtype

    assert cpu_has_native_bf16("flags : fpu avx2 avx512f avx512_bf16") and cpu_has_native_bf16("flags: amx_bf16 avx2")
    assert not cpu_has_native_bf16("flags : fpu avx2 fma")  # an AMD EPYC of this project's CI kind
    assert resolve_dtype("auto", cuda=True) == "bfloat16" and resolve_dtype("float16", cuda=False) == "float16"
    assert resolve_dtype("auto", cuda=False) == ("bfloat16" if cpu_has_native_bf16() else "float32")


def test_a_named_file_that_is_missing_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match=f"config file '{missing}.yaml' not found"):
        load_engine_config(f"{missing}.yaml")
    with pytest.raises(FileNotFoundError, match=f"engine.profile '{missing}.json' not found"):
        EngineConfig(profile=f"{missing}.json")
    with pytest.raises(FileNotFoundError, match=f"engine.augmentation_priors '{missing}.yaml' not found"):
        EngineConfig(augmentation_priors=f"{missing}.yaml")
    # A folder is not a config file either.
    with pytest.raises(FileNotFoundError, match="not found"):
        load_engine_config(str(tmp_path))


def test_profiles_measured_here_win_over_the_shipped_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engine_adapter.paths import configs_dir
    from engine_adapter.policy.profile import find_profile

    monkeypatch.setenv("INFERCEPT_HOME", str(tmp_path))
    shipped = configs_dir() / "profiles" / "default-cpu.json"
    assert find_profile("default", "cpu")[0] == shipped
    mine = tmp_path / "profiles" / "default-cpu.json"
    mine.parent.mkdir()
    mine.write_text(shipped.read_text())
    path, searched = find_profile("/models/default", "cpu")  # a model folder is looked up by its name
    assert path == mine and searched == [mine, shipped]
    assert find_profile("unknown-model", "cpu")[0] is None


def test_new_first_max_steps_reaches_the_core(tmp_path: Path) -> None:
    from dataclasses import replace

    from engine_adapter.intercept.build import build_core
    from tests.policy.test_core import Pool

    cfg = replace(EngineConfig(), policy="infercept-admit", new_first_max_steps=7)
    core_cfg = CoreConfig.from_additional_config({"infercept": cfg.core_config()})
    assert core_cfg.new_first_max_steps == 7
    core = build_core(core_cfg, Pool(), model="tiny", device="cpu", block_size=16, kv_bytes_per_token=1024, host_slots=8)
    assert core.settings.new_first_max_steps == 7 and core.spec.new_first
    # an older engine's additional config, without the key: the default
    old = {k: v for k, v in cfg.core_config().items() if k != "new_first_max_steps"}
    assert CoreConfig.from_additional_config({"infercept": old}).new_first_max_steps == 128
