"""Spotting credentials embedded in ``env`` / ``headers`` (Agent Plugins 1.0.0 §7.2.1, §9.2).

The spec forbids plugin authors from putting secrets there but does not let a client
refuse such a config, so a match is a warning and the server still loads. The check is
a heuristic on the key name and on well-known token shapes; the value itself never
appears in a diagnostic.
"""

from __future__ import annotations

import re

# Names that normally carry a credential (env keys and header names alike).
_SECRET_NAME = re.compile(
    r"(?:^|[_\-.])(?:api[_\-]?key|apikey|access[_\-]?key|secret|secret[_\-]?key|client[_\-]?secret|token|"
    r"access[_\-]?token|auth[_\-]?token|bearer|password|passwd|pwd|passphrase|credentials?|private[_\-]?key)$",
    re.IGNORECASE,
)
_SECRET_HEADERS = frozenset(
    ("authorization", "proxy-authorization", "cookie", "x-api-key", "api-key", "x-auth-token", "x-access-token")
)
# Well-known credential shapes, whatever the key is called.
_TOKEN_SHAPES = (
    re.compile(r"^(?:bearer|basic|token)\s+\S{8,}$", re.IGNORECASE),
    re.compile(r"^sk-[A-Za-z0-9_\-]{16,}$"),  # OpenAI / Anthropic style
    re.compile(r"^(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}$"),  # Stripe
    re.compile(r"^gh[pousr]_[A-Za-z0-9]{30,}$"),  # GitHub
    re.compile(r"^github_pat_[A-Za-z0-9_]{40,}$"),
    re.compile(r"^glpat-[A-Za-z0-9_\-]{20,}$"),  # GitLab
    re.compile(r"^xox[abprs]-[A-Za-z0-9\-]{10,}$"),  # Slack
    re.compile(r"^(?:AKIA|ASIA)[0-9A-Z]{16}$"),  # AWS access key id
    re.compile(r"^AIza[0-9A-Za-z_\-]{35}$"),  # Google API key
    re.compile(r"^hf_[A-Za-z0-9]{30,}$"),  # Hugging Face
    re.compile(r"^eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}$"),  # JWT
)
_ONLY_PLACEHOLDER = re.compile(r"^\$\{[^}]*\}$")


def looks_like_secret(key: str, value: str, *, header: bool = False) -> bool:
    """True if the ``key: value`` pair looks like it embeds a literal credential.

    An empty value or one that is just a ``${NAME}`` reference is not a literal
    credential (although the reference stays literal: see the placeholder rules).
    """
    text = value.strip()
    if not text or _ONLY_PLACEHOLDER.match(text):
        return False
    if any(shape.match(text) for shape in _TOKEN_SHAPES):
        return True
    if header and key.lower() in _SECRET_HEADERS:
        return True
    return _SECRET_NAME.search(key) is not None
