"""Operator login to a dashboard exposed beyond loopback: a link signed with an operator key.

An operator proves who they are the way every rollnet call does, with the Ed25519 key the
coordinator knows from its ``operators`` allow-list; no password or shared secret exists to
leak. ``rollnet dashboard login-url --key OPERATOR_KEY --url URL`` signs

    rollnet-dashboard-login-v1 \\n NETWORK_ID \\n EXPIRES (unix seconds) \\n NONCE (hex)

and prints ``URL/login?key=…&expires=…&nonce=…&sig=…``. The dashboard accepts a link once,
before it expires (at most :data:`MAX_LINK_SECONDS` ahead), when the key is an operator's and
the signature holds, and answers with a session cookie (HttpOnly, SameSite=Strict, Secure over
TLS) that lasts :data:`SESSION_SECONDS`. The private key never leaves the operator's machine.
Over plain HTTP the cookie could be read on the way: serve TLS (the coordinator's own
``--tls-cert``/``--tls-key`` are used) when the dashboard is reachable from other machines.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from urllib.parse import urlencode

from rollnet.sdk.identity import (
    Identity,
    b64url_decode,
    b64url_encode,
    node_id_from_public_key,
    verify_signature,
)

DOMAIN = b"rollnet-dashboard-login-v1"
#: How far ahead a login link may expire.
MAX_LINK_SECONDS = 600
#: How long a login lasts.
SESSION_SECONDS = 12 * 3600
#: The cookie that carries a session.
COOKIE = "rollnet_dashboard"


def login_message(network_id: str, expires: int, nonce: str) -> bytes:
    """The bytes an operator signs to log in (see the module docstring)."""
    return b"\n".join([DOMAIN, network_id.encode(), str(expires).encode(), nonce.encode()])


def login_query(identity: Identity, network_id: str, *, lifetime: int = 300) -> str:
    """The query string of a login link signed by ``identity``, valid for ``lifetime`` s."""
    expires = int(time.time()) + min(lifetime, MAX_LINK_SECONDS)
    nonce = secrets.token_hex(16)
    signature = identity.sign(login_message(network_id, expires, nonce))
    return urlencode(
        {
            "key": b64url_encode(identity.public_key),
            "expires": expires,
            "nonce": nonce,
            "sig": b64url_encode(signature),
        }
    )


class LoginRefused(Exception):
    """A login link that does not open a session; the message says why."""


@dataclass
class OperatorSessions:
    """Checks login links and keeps the sessions they open (in memory: a restart logs out)."""

    network_id: str
    operators: frozenset[str]
    _sessions: dict[str, tuple[str, float]] = field(default_factory=dict)
    _used_nonces: dict[str, float] = field(default_factory=dict)

    def log_in(self, key: str, expires: str, nonce: str, signature: str) -> tuple[str, str]:
        """Open a session for a valid link; returns ``(session token, operator node id)``."""
        now = time.time()
        try:
            public_key = b64url_decode(key)
            deadline = int(expires)
            raw_signature = b64url_decode(signature)
        except ValueError:
            raise LoginRefused("the login link is malformed") from None
        if not 16 <= len(nonce) <= 64 or not nonce.isalnum():
            raise LoginRefused("the login link is malformed")
        if deadline < now:
            raise LoginRefused("the login link has expired: make a new one")
        if deadline > now + MAX_LINK_SECONDS + 60:
            raise LoginRefused("the login link expires too far ahead")
        try:
            node_id = node_id_from_public_key(public_key)
        except ValueError:
            raise LoginRefused("the login link's key is not an Ed25519 public key") from None
        if node_id not in self.operators and public_key.hex() not in self.operators:
            raise LoginRefused(f"key {node_id} is not on the coordinator's operators allow-list")
        message = login_message(self.network_id, deadline, nonce)
        if not verify_signature(public_key, raw_signature, message):
            raise LoginRefused("the login link's signature does not hold (another network id?)")
        self._forget_expired(now)
        if nonce in self._used_nonces:
            raise LoginRefused("the login link was used already: make a new one")
        self._used_nonces[nonce] = deadline
        token = secrets.token_urlsafe(32)
        self._sessions[token] = (node_id, now + SESSION_SECONDS)
        return token, node_id

    def operator(self, token: str | None) -> str | None:
        """The operator node id of a live session, else ``None``."""
        if not token:
            return None
        found = self._sessions.get(token)
        if found is None or found[1] < time.time():
            return None
        return found[0]

    def _forget_expired(self, now: float) -> None:
        for nonce, deadline in list(self._used_nonces.items()):
            if deadline < now:
                del self._used_nonces[nonce]
        for token, (_node, deadline) in list(self._sessions.items()):
            if deadline < now:
                del self._sessions[token]
