"""Who is calling: the mTLS client certificate's common name, or a bearer token mapped to an identity.

Tokens never appear in code or configuration in clear: KUMIKI_QUOTA_TOKENS_FILE names a YAML mapping of
the token's SHA-256 (hex) to the identity (`sha256sum <<<"$TOKEN"` without the newline:
`printf %s "$TOKEN" | sha256sum`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import yaml

from kumiki.common.config import ConfigError, Environ, env_bool, env_file, env_float, one_line
from kumiki.quota.core import QuotaConfig, may_submit, parse_config

TOKENS_FILE = "KUMIKI_QUOTA_TOKENS_FILE"
ALLOW_ANONYMOUS = "KUMIKI_QUOTA_ALLOW_ANONYMOUS"
# identities that admit on behalf of callers they have checked themselves (placement, with its own queue-owner
# check: KUMIKI_PLACEMENT_QUEUES_FILE): their Admits skip the owner check, as an anonymous caller's do
DELEGATES = "KUMIKI_QUOTA_DELEGATES"
ANONYMOUS = None  # the identity of a caller in anonymous (development) mode: owner checks are skipped
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def load_tokens(path: Path, variable: str = TOKENS_FILE) -> dict[str, str]:
    """token SHA-256 (hex) -> identity, validated; errors name the variable (`variable`) and the entry."""
    try:
        data = yaml.safe_load(path.read_text())
    except (
        OSError,
        ValueError,
        OverflowError,
        yaml.YAMLError,
    ) as error:  # PyYAML: ValueError/OverflowError for a bad \U escape
        raise ConfigError(f"{variable}: cannot read {str(path)!r}: {one_line(error)}") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{variable}: expected a YAML mapping of token sha256 (hex) to identity in {path}")
    tokens = {}
    for digest, identity in data.items():
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise ConfigError(f"{variable}: key {str(digest)[:12]!r}...: expected 64 lower-case hex digits")
        if not isinstance(identity, str) or not identity:
            raise ConfigError(f"{variable}: identity of {digest[:12]}...: expected a non-empty string")
        tokens[digest] = identity
    return tokens


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class QuotaSettings:
    tokens: Mapping[str, str] = field(default_factory=dict, repr=False)
    mtls: bool = False
    allow_anonymous: bool = False
    delegates: frozenset[str] = frozenset()
    state_interval_s: float = 10.0
    half_life_s: float = 7 * 24 * 3600.0
    config_file: Path | None = None

    @classmethod
    def from_env(cls, env: Environ) -> QuotaSettings:
        path = env_file(env, TOKENS_FILE)
        tokens = load_tokens(path) if path else {}
        mtls = bool(env.get("KUMIKI_TLS_CLIENT_CAFILE"))
        anonymous = env_bool(env, ALLOW_ANONYMOUS, False)
        if not tokens and not mtls and not anonymous:
            raise ConfigError(
                f"{TOKENS_FILE}: no caller authentication configured; set {TOKENS_FILE} (bearer tokens) or"
                f" KUMIKI_TLS_CLIENT_CAFILE (mTLS), or {ALLOW_ANONYMOUS}=true for development only"
            )
        delegates = frozenset(name.strip() for name in env.get(DELEGATES, "").split(",") if name.strip())
        return cls(
            tokens=tokens,
            mtls=mtls,
            allow_anonymous=anonymous,
            delegates=delegates,
            state_interval_s=env_float(env, "KUMIKI_QUOTA_STATE_INTERVAL_S", 10.0, minimum=0.05, maximum=3600.0),
            half_life_s=env_float(env, "KUMIKI_QUOTA_HALF_LIFE_S", 7 * 24 * 3600.0, minimum=1.0, maximum=1e9),
            config_file=env_file(env, "KUMIKI_QUOTA_CONFIG_FILE"),
        )


class Unauthenticated(PermissionError):
    """The caller presented no identity we know."""


class Authenticator:
    def __init__(self, settings: QuotaSettings) -> None:
        self.tokens = dict(settings.tokens)
        self.allow_anonymous = settings.allow_anonymous
        self.delegates = settings.delegates

    def identity(self, context: grpc.aio.ServicerContext) -> str | None:
        """The caller's identity; None in anonymous mode with no credential presented, or for a delegate
        (KUMIKI_QUOTA_DELEGATES: it checked its own caller, so no owner check here)."""
        auth = context.auth_context() or {}
        names = auth.get("x509_common_name") or []
        if names:
            name = names[0]
            common_name = name.decode() if isinstance(name, bytes) else str(name)
            return ANONYMOUS if common_name in self.delegates else common_name
        for key, value in context.invocation_metadata() or ():
            if key.lower() == "authorization":
                text = value.decode() if isinstance(value, bytes) else value
                scheme, _, token = text.partition(" ")
                if scheme.lower() != "bearer" or not token.strip():
                    raise Unauthenticated("authorization: expected 'Bearer <token>'")
                digest = token_digest(token.strip())
                for known, identity in self.tokens.items():
                    if hmac.compare_digest(known, digest):
                        return ANONYMOUS if identity in self.delegates else identity
                raise Unauthenticated("the bearer token is not known")
        if self.allow_anonymous:
            return ANONYMOUS
        raise Unauthenticated("no client certificate or bearer token")


class QueueAuthorizer:
    """Who may name which queue, for a service other than quota (placement's Bind and Release): the caller's
    identity (the same Authenticator: mTLS CN or bearer token) against the same queue file's owners
    (quota.core.may_submit: an owner of a queue or of an ancestor). One model, two services."""

    def __init__(self, authenticator: Authenticator, config: QuotaConfig) -> None:
        self.authenticator = authenticator
        self.config = config

    @classmethod
    def from_env(cls, env: Environ, prefix: str) -> QueueAuthorizer | None:
        """None unless `{prefix}_QUEUES_FILE` names a queue file; then callers must authenticate with a token
        from `{prefix}_TOKENS_FILE` or a client certificate (KUMIKI_TLS_CLIENT_CAFILE)."""
        queues_variable, tokens_variable = f"{prefix}_QUEUES_FILE", f"{prefix}_TOKENS_FILE"
        queues = env_file(env, queues_variable)
        if queues is None:
            return None
        try:
            config = parse_config(yaml.safe_load(queues.read_text()))
        except (OSError, ValueError, OverflowError, yaml.YAMLError) as error:  # QueueConfigError is a ValueError
            raise ConfigError(f"{queues_variable}: {one_line(error)}") from None
        tokens_path = env_file(env, tokens_variable)
        tokens = load_tokens(tokens_path, tokens_variable) if tokens_path else {}
        mtls = bool(env.get("KUMIKI_TLS_CLIENT_CAFILE"))
        if not tokens and not mtls:
            raise ConfigError(
                f"{tokens_variable}: {queues_variable} checks callers against queue owners, but no caller"
                f" authentication is configured; set {tokens_variable} (bearer tokens) or KUMIKI_TLS_CLIENT_CAFILE"
            )
        return cls(Authenticator(QuotaSettings(tokens=tokens, mtls=mtls)), config)

    def identity(self, context: grpc.aio.ServicerContext) -> str:
        """The caller; raises Unauthenticated (never anonymous: this authorizer exists to check owners)."""
        identity = self.authenticator.identity(context)
        if identity is None:
            raise Unauthenticated("no client certificate or bearer token")
        return identity

    def refusal(self, identity: str, queue: str) -> str | None:
        """None when `identity` may bind into `queue`; otherwise why not (the queue named first)."""
        if queue not in self.config.queues:
            return f"queue {queue}: unknown queue (not in the queue file)"
        if not may_submit(self.config, identity, queue):
            return f"queue {queue}: {identity!r} is not one of its owners"
        return None
