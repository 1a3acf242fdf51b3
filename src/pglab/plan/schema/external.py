"""target.external: an existing server pglab measures as it is."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator
from pydantic_core import PydanticCustomError

from pglab.plan.schema.base import Strict, Text, _text

EXTERNAL_KEYS = ("host", "port", "user", "dbname", "sslmode")


class ExternalTarget(Strict):
    """An existing server pglab does not own: measured, never reconfigured, written only with double consent."""

    conninfo: Annotated[str, _text(1024)] = Field(
        description="libpq connection string: host, port, user, dbname (and sslmode); the password goes in a passfile")
    passfile: Text | None = Field(None, description="libpq password file (default: $PGPASSFILE or ~/.pgpass)")
    destructive: bool = Field(False, description="let pglab load/reset the pgbench dataset and run write workloads; "
                              "also needs --allow-destructive on the command line")
    bindir: Text | None = Field(None, description="directory of pgbench (default: newest installed)")

    @field_validator("conninfo")
    @classmethod
    def _conninfo(cls, v: str) -> str:
        from psycopg.conninfo import conninfo_to_dict

        try:
            params = conninfo_to_dict(v)
        except Exception:
            raise PydanticCustomError("conninfo", "is not a libpq connection string (key=value …)") from None
        if "password" in params:
            raise PydanticCustomError("conninfo", "holds a password; put it in a passfile (target.external.passfile)")
        unknown = sorted(set(params) - set(EXTERNAL_KEYS))
        if unknown:
            raise PydanticCustomError("conninfo", "'{key}' is not supported here; use only {keys}",
                                      {"key": unknown[0], "keys": ", ".join(EXTERNAL_KEYS)})
        missing = [k for k in ("host", "user", "dbname") if not params.get(k)]
        if missing:
            raise PydanticCustomError("conninfo", "needs {keys}", {"keys": ", ".join(missing)})
        return v

    def parameters(self) -> dict[str, str]:
        from psycopg.conninfo import conninfo_to_dict

        return {k: str(v) for k, v in conninfo_to_dict(self.conninfo).items()}
