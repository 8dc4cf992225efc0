"""What every part of the policy schema shares: strict, frozen records and names."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gateway.untrusted.media_urls import HOST_NAME


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$", max_length=128)]


def _host_name(host: str) -> str:
    if not HOST_NAME.fullmatch(host):
        raise ValueError(
            f"{host!r} is not a host name: letters, digits, '-' and '.' only "
            "(no scheme, port, path or wildcard)"
        )
    return host.lower()


HostName = Annotated[str, AfterValidator(_host_name)]  # compared lowercased
