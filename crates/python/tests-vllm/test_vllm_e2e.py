"""gdx's vLLM connector end to end, on vLLM's CPU build: prefill and decode engines in separate
processes (see conftest.py for the runs these tests read)."""

from __future__ import annotations

import re

#: A failed load must be settled (recomputed or failed) this soon after its request set
#: started: a dead peer whose connection resets fails at once, a silent one after the run's
#: io_timeout (30 s, generous for a loaded 2-core host), plus slack for the recompute.
FAILURE_BOUND_S = 50.0


def test_decode_outputs_equal_single_engine_and_kv_was_loaded(runs):
    a, s = runs["a"], runs["d1"]["sets"][0]
    assert s["token_ids"] == a["baseline"]
    # The prefill's own first token is the baseline's first token.
    assert a["prefill_first_token"] == [t[0] for t in a["baseline"]]
    # vLLM's counters: every prompt token but the last came from the connector, not compute.
    assert s["counters"]["external_prefix_cache_hits"] == sum(n - 1 for n in a["prompt_tokens"])
    log = runs["log"]["decode-1"]
    assert "connected to prefill-a (etcd, cluster vllm)" in log
    assert _loaded(log) >= len(a["prompts"])
    # The prefill freed each request's blocks when the decode engine said it had read them.
    assert runs["log"]["prefill-a"].count("was read by its decode engine") >= len(a["prompts"])


def test_layerwise_load_outputs_equal_single_engine(runs):
    a, s = runs["a"], runs["d3"]["sets"][0]
    assert s["token_ids"] == a["baseline"]
    assert s["counters"]["external_prefix_cache_hits"] == sum(n - 1 for n in a["prompt_tokens"])
    assert _loaded(runs["log"]["decode-3"]) == len(a["prompts"])


def _loaded(log: str) -> int:
    return len(re.findall(r"gdx: loaded \d+ block\(s\) of request", log))


def test_a_corrupted_block_changes_the_outputs(runs):
    a, s = runs["a"], runs["d1"]["sets"][1]
    # Copies 0 and 1 of prefill A were loaded (no failure), copy 1 then corrupted.
    assert _loaded(runs["log"]["decode-1"]) == 2 * len(a["prompts"])
    for got, want in zip(s["token_ids"], a["baseline"]):
        assert got != want


def test_layout_mismatch_is_a_named_error_before_any_byte_moves(runs):
    s = runs["d2"]["sets"][0]
    assert s["seconds"] < FAILURE_BOUND_S
    # kv_load_failure_policy=fail: vLLM fails every request instead of decoding garbage.
    assert s["finish_reasons"] == ["error"] * len(runs["a"]["prompts"])
    log = runs["log"]["decode-2"]
    assert "LayoutMismatch: KV layout mismatch with prefill-a at 127.0.0.1:" in log
    assert "block_size 64 here, 32 there" in log
    assert "no KV byte was moved" in log
    assert "gdx: loaded" not in log


def test_prefill_killed_mid_transfer_is_recomputed_within_bound(runs):
    b, s = runs["b"], runs["d1"]["sets"][2]
    assert runs["mark"] == {"outstanding_at_kill": True, "killed_at": runs["mark"]["killed_at"]}
    assert s["seconds"] < FAILURE_BOUND_S
    # kv_load_failure_policy=recompute: the decode engine computed the prompts itself.
    assert s["token_ids"] == b["baseline"]
    log = runs["log"]["decode-1"]
    failures = re.findall(r"gdx: loading the KV of request \S+ \(\d+ blocks\) from \S+ failed "
                          r"after [\d.]+ s: (\w+)", log)
    assert len(failures) == len(b["prompts"])
    assert set(failures) <= {"PeerLost", "Timeout"}
