"""The format checker every validation path uses: each format in ``ASSERTED`` is checked.

jsonschema asserts a format only when the library that checks it is installed; localllm
depends on ``jsonschema[format-nongpl]`` (rfc3339-validator for ``date-time``/``time``,
rfc3986-validator for ``uri``/``uri-reference``, fqdn for ``hostname``, idna for
``idn-hostname``, uri-template, isoduration, jsonpointer, webcolors) so the endpoint and
fallback paths are as strict as the compiled grammar. ``iri``/``iri-reference`` are checked
here instead of by rfc3987-syntax (a lark parser, ~50 ms per string measured): the IRI is
mapped to a URI as RFC 3987 §3.1 says (non-ASCII characters, which must be ``ucschar``, or
``iprivate`` in the query, percent-encoded as UTF-8) and the URI is checked by RFC 3986.
``regex`` is ``re.compile`` as in jsonschema, with what else it raises on a hostile string (a
RecursionError for 5,000 nested groups, an OverflowError) a failed check, and its warnings
(``FutureWarning: Possible nested set``) kept quiet. ``uri-template`` fails a ``{`` that no
``}`` follows before uri-template's splitting regex sees it (quadratic there: 10 s for
100,000 of them); every other template is uri-template's to judge.
"""

from __future__ import annotations

import functools
import re
import warnings
from typing import Any
from urllib.parse import quote

__all__ = ["ASSERTED", "format_checker", "missing_formats"]

#: every format a validator built by :func:`format_checker` asserts (the README lists them)
ASSERTED = (
    "date",
    "date-time",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uri-template",
    "uuid",
    "json-pointer",
    "relative-json-pointer",
    "regex",
)


def _ucschar(cp: int, in_query: bool) -> bool:
    if 0xA0 <= cp <= 0xD7FF or 0xF900 <= cp <= 0xFDCF or 0xFDF0 <= cp <= 0xFFEF:
        return True
    if 0x10000 <= cp <= 0xEFFFD and (cp & 0xFFFF) <= 0xFFFD:
        return True
    # iprivate: only in the query
    return in_query and (0xE000 <= cp <= 0xF8FF or 0xF0000 <= cp <= 0xFFFFD or 0x100000 <= cp <= 0x10FFFD)


def _iri_to_uri(text: str) -> str | None:
    """The URI an IRI maps to (RFC 3987 §3.1), or None when a character is not allowed."""
    out = []
    in_query = False
    for ch in text:
        if ch == "?":
            in_query = True
        elif ch == "#":
            in_query = False
        cp = ord(ch)
        if cp < 0x80:
            out.append(ch)
        elif _ucschar(cp, in_query):
            out.append(quote(ch, safe=""))
        else:
            return None
    return "".join(out)


def _iri_checker(rule: str) -> Any:
    def check(instance: object) -> bool:
        if not isinstance(instance, str):
            return True
        from rfc3986_validator import validate_rfc3986

        uri = _iri_to_uri(instance)
        return uri is not None and bool(validate_rfc3986(uri, rule=rule))

    return check


@functools.lru_cache(maxsize=16)
def format_checker(cls: Any) -> Any:
    """``cls.FORMAT_CHECKER`` (the draft's formats) with the IRI formats checked fast and
    ``regex`` checked without a raw exception or a warning."""
    from localllm import _jsonschema

    _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
    import jsonschema

    checker = jsonschema.FormatChecker([])
    checker.checkers = dict(cls.FORMAT_CHECKER.checkers)
    if "regex" in checker.checkers:
        checker.checkers["regex"] = (_is_regex, ())
    if "uri-template" in checker.checkers:
        checker.checkers["uri-template"] = (_uri_template(checker.checkers["uri-template"][0]), ())
    try:
        import rfc3986_validator  # noqa: F401
    except ImportError:
        return checker
    for name, rule in (("iri", "URI"), ("iri-reference", "URI_reference")):
        if name in checker.checkers:
            checker.checkers[name] = (_iri_checker(rule), ())
    return checker


def _is_regex(instance: object) -> bool:
    if not isinstance(instance, str):
        return True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            re.compile(instance)
        except (re.error, RecursionError, OverflowError, MemoryError):
            return False
    return True


def _uri_template(check: Any) -> Any:
    def is_uri_template(instance: object) -> bool:
        if isinstance(instance, str) and "{" in instance[instance.rfind("}") + 1 :]:
            return False  # an expression never closed
        return bool(check(instance))

    return is_uri_template


def missing_formats(cls: Any) -> list[str]:
    """The formats of ``ASSERTED`` the draft has but this installation cannot check (the
    format extras are missing): empty when localllm is installed with its dependencies."""
    from localllm import _jsonschema

    _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
    import jsonschema

    known = {"date-time", "email", "hostname", "ipv4", "ipv6", "regex", "uri"}
    if cls is not jsonschema.Draft4Validator:
        known |= {"uri-reference", "json-pointer", "uri-template"}
        if cls is not jsonschema.Draft6Validator:
            known |= {"date", "time", "idn-email", "idn-hostname", "iri", "iri-reference", "relative-json-pointer"}
            if cls is not jsonschema.Draft7Validator:
                known |= {"duration", "uuid"}
    have = format_checker(cls).checkers
    return [f for f in ASSERTED if f in known and f not in have]
