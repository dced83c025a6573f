from __future__ import annotations

import pytest

from augmentations.factory import build_registry, validate_settings
from gateway.config import load_gateway_config


def test_registry_from_settings() -> None:
    reg, timeouts = build_registry({"calculator": {"timeout_s": 2}, "wikipedia": {"enabled": False}, "human": {}})
    assert reg.names() == ["Calculator", "AskHuman"]
    assert timeouts == {"Calculator": 2, "AskHuman": None}
    assert reg.hints(["calculator"])["Calculator"].aug_type == "math"
    # One matching rule: executor names and config keys, any case.
    assert [reg.resolve(n) for n in ("human", "askhuman", " Calculator ", "wikipedia", "nope")] == [
        "AskHuman", "AskHuman", "Calculator", None, None]  # wikipedia is disabled


@pytest.mark.parametrize("settings, message", [
    ({"abacus": {}}, "unknown tool 'abacus'"),
    ({"calculator": {"colour": 1}}, "calculator: unknown setting"),
    ({"calculator": {"timeout_s": -1}}, "timeout_s must be a positive number"),
])
def test_bad_settings_name_the_key(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_settings(settings)


def test_bad_executor_argument_is_reported() -> None:
    with pytest.raises(ValueError, match="augmentations.tts"):
        build_registry({"tts": {"backend": "gramophone"}})


def test_gateway_config_validation(tmp_path) -> None:
    good = tmp_path / "g.yaml"
    good.write_text("server: {port: 9001, max_sessions: 3}\naugmentations: {calculator: {}}\n")
    cfg = load_gateway_config(str(good), api_key="k")
    assert (cfg.server.port, cfg.server.max_sessions, cfg.server.api_key) == (9001, 3, "k")
    assert list(cfg.augmentations) == ["calculator"]
    for text, msg in [
        ("server: {port: '80'}\n", "server.port: expected int"),
        ("server: {colour: red}\n", "unknown setting"),
        ("server: {max_sessions: 0}\n", "must be positive"),
        ("servers: {}\n", "unknown section"),
        ("augmentations: [calculator]\n", "expected a mapping"),
    ]:
        bad = tmp_path / "b.yaml"
        bad.write_text(text)
        with pytest.raises(ValueError, match=msg):
            load_gateway_config(str(bad))


def test_shipped_config_loads() -> None:
    from engine_adapter.config import load_engine_config
    from engine_adapter.paths import shipped_config

    cfg = load_gateway_config(str(shipped_config("default.yaml")))
    assert set(cfg.augmentations) == {"calculator", "wikipedia", "alfworld", "image", "tts", "human"}
    assert load_engine_config(str(shipped_config("default.yaml"))).policy == "infercept"
