"""API keys: `Authorization: Bearer <key>` on every route but the probes (and, if so set, metrics).

Keys come from settings and/or a file (one per line, `#` comments), so a Kubernetes secret can be
mounted rather than put in the environment. Every key is compared in constant time, and all of
them are always compared, so the answer's timing tells nothing about how close a guess was.
With no key configured the service is open, as TEI is without `--api-key`.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from pathlib import Path

from service.api.errors import ApiError

#: liveness, readiness and health stay public: orchestrators probe them without credentials
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/health"})


ADMIN_PREFIX = "/admin/"


class ApiKeys:
    """`keys` open the API; `admin_keys` open it and /admin/ too. No admin key: /admin/ is closed."""

    def __init__(self, keys: list[str], *, admin_keys: Sequence[str] = (), metrics_public: bool = True):
        self._keys = [k.encode() for k in keys if k]
        self._admin = [k.encode() for k in admin_keys if k]
        self.public = PUBLIC_PATHS | ({"/metrics"} if metrics_public else set())

    @property
    def open(self) -> bool:
        """No key at all: every route but /admin/ answers anyone (said at start: service.supervisor)."""
        return not self._keys

    @property
    def admin_open(self) -> bool:
        """An admin key is set: /admin/ answers its holders (no admin key: /admin/ refuses everyone)."""
        return bool(self._admin)

    @classmethod
    def load(cls, keys: str | None, keys_file: Path | None, *, admin_keys: str | None = None,
             admin_keys_file: Path | None = None, metrics_public: bool = True) -> ApiKeys:
        return cls(_read(keys, keys_file), admin_keys=_read(admin_keys, admin_keys_file), metrics_public=metrics_public)

    def check(self, path: str, authorization: bytes | None) -> ApiError | None:
        admin = path.startswith(ADMIN_PREFIX)
        if admin and not self._admin:
            return ApiError(403, "admin routes are closed: set SEMBED_ADMIN_API_KEYS to open them", "Unauthorized")
        if not admin and (not self._keys or path in self.public):
            return None
        scheme, _, token = (authorization or b"").partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            return self._refuse("missing API key: send Authorization: Bearer <key>")
        token = token.strip()
        matched = False
        for key in self._admin if admin else self._keys + self._admin:  # no early exit
            matched |= hmac.compare_digest(token, key)
        return None if matched else self._refuse("invalid API key" if not admin else "not an admin key")

    @staticmethod
    def _refuse(message: str) -> ApiError:
        return ApiError(401, message, "Unauthorized", headers={"WWW-Authenticate": 'Bearer realm="sembed"'})


def _read(keys: str | None, keys_file: Path | None) -> list[str]:
    found = [k.strip() for k in (keys or "").split(",")]
    if keys_file is not None:
        lines = Path(keys_file).read_text().splitlines()
        found += [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return [k for k in found if k]
