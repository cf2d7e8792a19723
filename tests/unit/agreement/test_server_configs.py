"""The gate of a key rotation on every API server (issue 19), as tables.

Issue 19: "No write until every live server reports the same configuration hash";
"A server that serves no such metric is 'unknown', and this is never treated as
agreement"; "If the hash changes mid-run, the proof is void: run a new pass, or
end Failed with the verdict 'not proven, keep the old key'"; "An operator who
knowingly accepts the risk can pass an explicit override ... It is never the default."
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from recorded import REFERENCE

from storage_migrator.agreement.server_configs import (
    ConfigSample,
    IdentityLease,
    ServerConfigs,
    decide_config_gate,
    id_hash,
    missing_ids,
    server_configs,
)
from storage_migrator.agreement.server_metrics import parse_config_samples

NOW = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
METRICS_REFERENCE = REFERENCE / "apiserver-metrics-encryption-config.txt"
H1, H2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def lease(name: str, *, age: float = 5, duration: int = 3600) -> IdentityLease:
    return IdentityLease(name=name, holder=f"{name}_uuid", renew_time=NOW - timedelta(seconds=age),
                         duration_seconds=duration)  # fmt: skip


def sample(server: str | None, config: str | None, *, at: datetime = NOW, via: str = "https://a") -> ConfigSample:
    return ConfigSample(id_hash=id_hash(server) if server else None, config_hash=config, via=via, heard_at=at)


def table(*rows: tuple[str, str | None]) -> ServerConfigs:
    return server_configs([lease(s) for s, _ in rows], [sample(s, h) for s, h in rows if h], now=NOW)


def test_the_id_hash_is_that_of_the_identity_lease_as_checked_on_a_real_server() -> None:
    """reference/apiserver-metrics-encryption-config.txt: sha256 of the lease name."""
    text = METRICS_REFERENCE.read_text()
    (parsed,) = parse_config_samples(text, via="https://10.0.0.1:6443", heard_at=NOW)
    assert parsed.id_hash == id_hash("apiserver-wlv32tlttr4jl3gtroqexyxapa")
    assert parsed.config_hash == "sha256:571b1c486a34d3160af8a79ad1c08a159faf0e9409922f8f23d44404aabe7b48"


def test_metrics_without_the_family_are_an_answer_of_no_such_metric() -> None:
    text = '# TYPE apiserver_request_total counter\napiserver_request_total{verb="GET"} 3\n'
    (parsed,) = parse_config_samples(text, via="https://b", heard_at=NOW)
    assert (parsed.id_hash, parsed.config_hash) == (None, None)


def test_only_live_leases_are_servers_and_the_newest_sample_of_each_counts() -> None:
    old = NOW - timedelta(seconds=30)
    configs = server_configs(
        [lease("apiserver-a"), lease("apiserver-b"), lease("apiserver-gone", age=4000)],
        [sample("apiserver-a", H1, at=old), sample("apiserver-a", H2), sample("apiserver-gone", H1),
         sample("apiserver-stranger", H1)],
        now=NOW,
    )  # fmt: skip
    assert [(s.server_id, s.config_hash) for s in configs.servers] == [("apiserver-a", H2), ("apiserver-b", None)]
    assert configs.common_hash is None  # b was not heard: unknown is never agreement
    assert missing_ids([lease("apiserver-a"), lease("apiserver-b")], [sample("apiserver-a", H2)], now=NOW) == {
        id_hash("apiserver-b")
    }


GATE = [
    # (servers, moment, baseline, action, reason)
    ([("a", H1), ("b", H1), ("c", H1)], "start", None, "go", ""),
    ([("a", H2), ("b", H1), ("c", H1)], "start", None, "abort", "EncryptionConfigurationsDiffer"),  # rolling
    ([("a", H1), ("b", None), ("c", H1)], "start", None, "abort", "EncryptionConfigurationsDiffer"),  # no metric
    ([], "start", None, "abort", "EncryptionConfigurationsDiffer"),  # no identity lease at all
    ([("a", H1), ("b", H1)], "chunk", H1, "go", ""),
    ([("a", H1), ("b", H2)], "chunk", H1, "abort", "EncryptionConfigurationChanged"),  # one changed back
    ([("a", H1), ("b", None)], "end", H1, "abort", "EncryptionConfigurationChanged"),
    ([("a", H2), ("b", H2)], "chunk", H1, "rerun", "EncryptionConfigurationChanged"),  # all moved together
    ([("a", H2), ("b", H2)], "end", H1, "rerun", "EncryptionConfigurationChanged"),
]


@pytest.mark.parametrize(("servers", "moment", "baseline", "action", "reason"), GATE)
def test_the_gate(servers: list[tuple[str, str | None]], moment: str, baseline: str | None, action: str,
                  reason: str) -> None:  # fmt: skip
    verdict = decide_config_gate(moment=moment, baseline=baseline, now=table(*servers))  # type: ignore[arg-type]
    assert (verdict.action, verdict.reason) == (action, reason), verdict.message
    if action == "abort":
        assert "keep the old key" in verdict.message or "nothing was written" in verdict.message


def test_the_message_names_each_server_and_what_it_runs() -> None:
    verdict = decide_config_gate(moment="start", baseline=None, now=table(("apiserver-a", H2), ("apiserver-b", H1)))
    assert (
        "apiserver-a: sha256:222222222222" in verdict.message and "apiserver-b: sha256:111111111111" in verdict.message
    )


def test_a_server_without_the_metric_is_named_with_why() -> None:
    configs = server_configs([lease("apiserver-a")], [sample(None, None, via="https://10.0.0.1:6443")], now=NOW,
                             unheard={"https://10.0.0.1:6443": "its /metrics has no apiserver_encryption_config_"})  # fmt: skip
    verdict = decide_config_gate(moment="start", baseline=None, now=configs)
    assert verdict.action == "abort"
    assert "apiserver-a" in verdict.message and "https://10.0.0.1:6443" in verdict.message
    assert "never taken as agreeing" in verdict.message


def test_a_configuration_that_keeps_moving_stops_after_max_passes() -> None:
    verdict = decide_config_gate(moment="end", baseline=H1, now=table(("a", H2)), passes=3)
    assert (verdict.action, verdict.reason) == ("abort", "EncryptionConfigurationUnstable")


@pytest.mark.parametrize("moment", ["start", "chunk", "end"])
def test_the_override_never_aborts_and_is_never_the_default(moment: str) -> None:
    differ = table(("a", H1), ("b", H2))
    assert decide_config_gate(moment=moment, baseline=H1, now=differ, override=True).action == "go"  # type: ignore[arg-type]
    assert decide_config_gate(moment=moment, baseline=H1, now=differ).action == "abort"  # type: ignore[arg-type]


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.sampled_from([H1, H2, None])), min_size=1, max_size=6,
                unique_by=lambda t: t[0]))  # fmt: skip
def test_go_at_the_start_exactly_when_every_live_server_reports_one_hash(servers: list[tuple[str, str | None]]) -> None:
    verdict = decide_config_gate(moment="start", baseline=None, now=table(*servers))
    hashes = {h for _, h in servers}
    assert (verdict.action == "go") == (None not in hashes and len(hashes) == 1)
