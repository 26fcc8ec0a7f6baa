"""One `redact()` for every text that leaves a process: log lines, dead-letter errors, exceptions.

Webhook URLs are credentials in disguise: a Slack or Discord webhook URL *is* its token, a URL
may carry `user:password@`, a query may carry `?token=`, and a receiver may echo our
Authorization header in its error page. Patterns catch the shapes we know; the values of the
secrets this process loaded (`remember`) are replaced wherever they appear, whatever the shape.
Redacting twice gives the same text, so callers need not know whether a text was redacted.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from pipeline.errors import ConfigError

MASK = "***"
_MIN_REMEMBERED = 4  # shorter values would mask ordinary words; patterns still apply

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # userinfo: scheme://user:password@host, scheme://token@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s'\"]+@"), rf"\1{MASK}@"),
    # query parameters whose name says secret: ?token= &api_key= &sig= &X-Amz-Signature= ...
    (
        re.compile(
            r"(?i)([?&;][\w.-]*(?:token|key|sig|signature|secret|password|passwd|pwd|auth"
            r"|credential|code)[\w.-]*=)[^&#\s'\"]+"
        ),
        rf"\1{MASK}",
    ),
    # Slack incoming webhooks / workflows: the path is the token (host may be elsewhere in an
    # error message: urllib3 says "host='hooks.slack.com' ... url: /services/T0/B0/xyz")
    (re.compile(r"(/services/T[A-Za-z0-9]+/B[A-Za-z0-9]+/)[A-Za-z0-9]+"), rf"\1{MASK}"),
    (re.compile(r"(/(?:workflows|triggers)/T[A-Za-z0-9]+/)[A-Za-z0-9/]+"), rf"\1{MASK}"),
    # Discord (and Slack-compatible /slack suffix): /api/webhooks/<id>/<token>
    (re.compile(r"(/api/webhooks/\d+/)[\w-]+"), rf"\1{MASK}"),
    # Microsoft Teams (office.com webhookb2 / IncomingWebhook paths)
    (re.compile(r"(?i)(/webhookb2/|/IncomingWebhook/)[^\s'\"?#]+"), rf"\1{MASK}"),
    # Telegram bots: /bot<id>:<token>/
    (re.compile(r"(/bot)\d+:[\w-]+"), rf"\1{MASK}"),
    # Authorization header values, wherever they are echoed
    (re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=-]{6,}"), rf"\1\2{MASK}"),
    # Standard Webhooks secrets
    (re.compile(r"whsec_[A-Za-z0-9+/=]+"), f"whsec_{MASK}"),
)

_remembered: set[str] = set()


def remember(*secrets: str) -> None:
    """Mask these values wherever they appear from now on (secrets loaded from env or files)."""
    for secret in secrets:
        if len(secret) >= _MIN_REMEMBERED:
            _remembered.add(secret)


def load_secret(value: str, path: str, setting: str) -> str:
    """A credential from its setting or, when `path` is set, its file (trailing newline
    dropped), remembered so that it is masked from now on. `setting` names it in errors."""
    if path:
        try:
            value = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
        except OSError as exc:
            raise ConfigError(f"{setting}_file {path}: {exc.strerror}") from None
        if not value:
            raise ConfigError(f"{setting}_file {path} is empty")
    remember(value)
    return value


def redact(text: str) -> str:
    """`text` with credentials masked: userinfo, secret query parameters, token paths, auth
    header values, and every remembered secret."""
    # longest first, so a secret containing another is masked whole
    for secret in sorted(_remembered, key=len, reverse=True):
        text = text.replace(secret, MASK)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class RedactingFilter(logging.Filter):
    """Redacts a record's message in place: for libraries that log URLs we cannot reword
    (urllib3 logs every request line at DEBUG, query tokens and token paths included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact(record.getMessage()), ()
        return True


def redact_logs(*logger_names: str) -> None:
    """Install RedactingFilter on these loggers (once each). A logger's filter sees only what
    is logged on it, not on its children, so name the logger that logs."""
    for name in logger_names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())
