"""Which encryption configuration every API server runs, and whether a key rotation may write.

Design decision (issue 19): a rotation is only proven if every API server wrote
with the same keys while it ran. A server whose write key is still the old one
reads old-key values as current, so a proof pass through it rewrites nothing and
looks clean; its next writes go under the old key. Tools that rotate keys for a
living gate each phase on every server agreeing (k3s compares the
encryption-configuration hash of every server; OpenShift waits for one revision
everywhere). We do the same without touching key material:

- the servers are their identity Leases in ``kube-system`` (label
  ``apiserver.kubernetes.io/identity=kube-apiserver``; live while
  ``renewTime + leaseDurationSeconds`` is ahead), the ids the StorageVersion API
  uses too;
- each one reports its configuration on ``/metrics`` as
  ``apiserver_encryption_config_controller_last_config_info{apiserver_id_hash, hash}``
  (reference/apiserver-metrics-encryption-config.txt), where ``apiserver_id_hash``
  is ``sha256:`` + hex sha256 of the lease's name: each answer says whose it is,
  so samples taken through a load balancer can be matched to servers.

A live server that was not heard, or that serves no such metric, is *unknown*,
and unknown is never agreement. Pure functions over observations; the flows
only ask at the moments :func:`decide_config_gate` names, the same moments as
seed 001's check of the StorageVersion (:mod:`storage_migrator.agreement.storage_versions`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.agreement.storage_versions import MAX_PASSES, AgreementMoment, AgreementVerdict

__all__ = [
    "CONFIG_METRIC",
    "GATE_GO",
    "ConfigSample",
    "IdentityLease",
    "ServerConfig",
    "ServerConfigs",
    "decide_config_gate",
    "id_hash",
    "missing_ids",
    "server_configs",
]

#: kube-apiserver's gauge of the encryption configuration each server last applied (v1.36, ALPHA).
CONFIG_METRIC: Final = "apiserver_encryption_config_controller_last_config_info"

GATE_GO: Final = AgreementVerdict(action="go")


def id_hash(server_id: str) -> str:
    """``apiserver_id_hash`` of a server: ``sha256:`` + hex sha256 of its identity Lease's name (checked on v1.36.2)."""
    return "sha256:" + hashlib.sha256(server_id.encode()).hexdigest()


class IdentityLease(BaseModel):
    """One API server's identity Lease, as read (no spec beyond what liveness needs)."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="metadata.name: the server's id (apiserver-<hash>).")
    holder: str = Field(default="", description="spec.holderIdentity: <id>_<uuid of the process>.")
    renew_time: datetime | None = None
    duration_seconds: int | None = None

    def live(self, now: datetime) -> bool:
        """kube-apiserver's lease GC deletes a lease once ``renewTime + leaseDurationSeconds`` is past."""
        if self.renew_time is None or self.duration_seconds is None:
            return False
        return self.renew_time + timedelta(seconds=self.duration_seconds) > now


class ConfigSample(BaseModel):
    """One answer of ``/metrics``: whose it is, the configuration hash (None: no such metric), and where."""

    model_config = ConfigDict(frozen=True)

    id_hash: str | None = Field(description="apiserver_id_hash; None when the answer had no such metric.")
    config_hash: str | None = None
    via: str = Field(description="The address asked (a server's own endpoint, or the cluster's).")
    heard_at: datetime


class ServerConfig(BaseModel):
    """One live API server and the configuration it reported (None: unknown)."""

    model_config = ConfigDict(frozen=True)

    server_id: str
    id_hash: str
    config_hash: str | None = None
    heard_at: datetime | None = None
    via: str | None = None

    @property
    def state(self) -> str:
        return self.config_hash or "unknown"


class ServerConfigs(BaseModel):
    """What every live API server runs: the table ``storage-migrator discover`` shows."""

    model_config = ConfigDict(frozen=True)

    servers: list[ServerConfig] = Field(default_factory=list)
    observed_at: datetime
    unheard: dict[str, str] = Field(
        default_factory=dict, description="Address -> why it did not answer (a 403 names the permission)."
    )

    @property
    def common_hash(self) -> str | None:
        """The hash every live server reported, or None (no server, one unknown, or two differ)."""
        hashes = {s.config_hash for s in self.servers}
        if not self.servers or None in hashes or len(hashes) != 1:
            return None
        return next(iter(hashes))

    def describe(self) -> str:
        """``apiserver-a: sha256:1234abcd…, apiserver-b: unknown``, for messages (hashes shortened)."""
        return ", ".join(f"{s.server_id}: {_short(s.config_hash)}" for s in self.servers) or "no live API server"

    def rows(self) -> list[dict[str, str]]:
        """The per-server table (log lines, artifacts, the CLI)."""
        return [
            {"server": s.server_id, "config hash": s.config_hash or "unknown",
             "heard": s.heard_at.isoformat() if s.heard_at else "never", "via": s.via or "-"}
            for s in self.servers
        ]  # fmt: skip


def _short(config_hash: str | None) -> str:
    if config_hash is None:
        return "unknown"
    return config_hash[: len("sha256:") + 12] + "…"


def server_configs(
    leases: Iterable[IdentityLease],
    samples: Iterable[ConfigSample],
    *,
    now: datetime,
    unheard: dict[str, str] | None = None,
) -> ServerConfigs:
    """One row per live server, with the newest sample of its id hash; samples of no live server are dropped
    (a server gone since: its lease expired, so it writes nothing)."""
    newest: dict[str, ConfigSample] = {}
    for sample in samples:
        if sample.id_hash is None:
            continue
        seen = newest.get(sample.id_hash)
        if seen is None or sample.heard_at >= seen.heard_at:
            newest[sample.id_hash] = sample
    rows = []
    for lease in sorted(leases, key=lambda item: item.name):
        if not lease.live(now):
            continue
        digest = id_hash(lease.name)
        heard = newest.get(digest)
        rows.append(
            ServerConfig(server_id=lease.name, id_hash=digest, config_hash=heard.config_hash if heard else None,
                         heard_at=heard.heard_at if heard else None, via=heard.via if heard else None)
        )  # fmt: skip
    return ServerConfigs(servers=rows, observed_at=now.astimezone(UTC), unheard=dict(unheard or {}))


def missing_ids(leases: Iterable[IdentityLease], samples: Sequence[ConfigSample], *, now: datetime) -> set[str]:
    """Id hashes of live servers no sample came from yet: whom the sampler still has to hear."""
    heard = {s.id_hash for s in samples if s.config_hash is not None}
    return {id_hash(lease.name) for lease in leases if lease.live(now)} - heard


def _why_not_common(configs: ServerConfigs) -> str:
    if not configs.servers:
        return ("no live API server identity Lease in kube-system (label apiserver.kubernetes.io/identity="
                "kube-apiserver): the servers cannot be told apart; turn on the APIServerIdentity feature gate")  # fmt: skip
    unknown = [s.server_id for s in configs.servers if s.config_hash is None]
    if unknown:
        why = "; ".join(f"{address}: {reason}" for address, reason in sorted(configs.unheard.items()))
        return (f"API server(s) {', '.join(unknown)} reported no {CONFIG_METRIC} on /metrics "
                f"({why or 'not heard, or a server without the metric'}); an unknown server is never taken as "
                "agreeing")  # fmt: skip
    return f"the API servers run different encryption configurations ({configs.describe()})"


def decide_config_gate(
    *,
    moment: AgreementMoment,
    baseline: str | None,
    now: ServerConfigs,
    passes: int = 1,
    max_passes: int = MAX_PASSES,
    override: bool = False,
) -> AgreementVerdict:
    """Issue 19's gate for a run that names an encryption key, as a table.

    - ``start``: no write until every live server reports one configuration hash:
      abort ``EncryptionConfigurationsDiffer`` otherwise (the caller waits and asks
      again until its timeout; nothing was written).
    - ``chunk`` and ``end``: servers that no longer agree void the pass: abort
      ``EncryptionConfigurationChanged`` ("not proven, keep the old key"); one new
      common hash, other than ``baseline`` (the hash the pass began under), voids it
      too, but every server now writes alike, so the run migrates again from the
      beginning, at most ``max_passes`` passes in all.
    - ``override``: the operator accepts the risk; never aborts (the caller logs
      and records it). It is never the default.
    """
    common = now.common_hash
    if override:
        return GATE_GO
    if common is None:
        if moment == "start":
            return AgreementVerdict(
                action="abort", reason="EncryptionConfigurationsDiffer",
                message=(f"{_why_not_common(now)}: nothing was written. Make the same EncryptionConfiguration "
                         "the one every API server runs (and restart or reload them), then run again."),
            )  # fmt: skip
        return AgreementVerdict(
            action="abort", reason="EncryptionConfigurationChanged",
            message=(f"{_why_not_common(now)} while the migration ran (it began under {_short(baseline)}): "
                     "the pass proves nothing; not proven, keep the old key. The checkpoint is kept."),
        )  # fmt: skip
    if moment == "start" or baseline is None or common == baseline:
        return GATE_GO
    moved = f"the API servers' encryption configuration changed from {_short(baseline)} to {_short(common)}"
    if passes >= max_passes:
        return AgreementVerdict(
            action="abort", reason="EncryptionConfigurationUnstable",
            message=f"{moved}, in each of {passes} passes: not proven, keep the old key; run it again once it settles.",
        )  # fmt: skip
    return AgreementVerdict(
        action="rerun", reason="EncryptionConfigurationChanged",
        message=f"{moved} during the pass: migrating again from the beginning (pass {passes + 1} of at most "
                f"{max_passes}).",
    )  # fmt: skip
