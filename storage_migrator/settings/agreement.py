"""The settings for hearing every API server (DESIGN 4.4 and 5, issue 19)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import NoDecode


class AgreementSettings(BaseModel):
    """Hearing every API server: their addresses and how long a rotation waits for them (DESIGN 4.4, issue 19)."""

    # NoDecode: the comma form is split by _split_servers, not parsed as JSON first.
    api_servers: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description=(
            "URLs of every API server, for HA agreement when the StorageVersion API is not "
            "served (DESIGN 4.4: one discovery poll per server), e.g. "
            "'https://10.0.0.1:6443,https://10.0.0.2:6443'; the kubeconfig's credentials are "
            "used for each. Default: none, which means the EndpointSlices of the `kubernetes` "
            "Service, and one server when they list one address."
        ),
    )
    server_config_timeout_seconds: float = Field(
        default=600.0,
        ge=0,
        description=(
            "How long a run that names an encryption key waits, before its first write, for every "
            "API server to report the same encryption configuration on /metrics (issue 19); past it "
            "the run fails and nothing is written. Default 600: a rolling restart of the servers."
        ),
    )
    server_config_poll_seconds: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between two looks at the API servers' configurations while waiting. Default 5.",
    )

    @field_validator("api_servers", mode="before")
    @classmethod
    def _split_servers(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            return json.loads(text) if text.startswith("[") else [p.strip() for p in text.split(",") if p.strip()]
        return value

    @field_validator("api_servers")
    @classmethod
    def _check_servers(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("https://", "http://")):
                raise ValueError(f"{url!r} is not an API server URL: expected https://HOST:PORT")
        return [url.rstrip("/") for url in value]
