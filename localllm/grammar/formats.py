"""The format checker every validation path uses: each format in ``ASSERTED`` is checked.

jsonschema asserts a format only when the library that checks it is installed; localllm
depends on ``jsonschema[format-nongpl]`` (rfc3986-validator for ``uri``/``uri-reference``,
idna for ``idn-hostname``, jsonpointer, webcolors, ...) so the endpoint and fallback paths
are as strict as the compiled grammar. Where a library decides differently from the
JSON-Schema-Test-Suite's format tests, the format is checked here as its RFC's grammar says
(:data:`_STRICT`: ``date``, ``time``, ``date-time``, ``duration``, ``email``, ``hostname``,
``uuid``, ``relative-json-pointer``, ``uri-template``; every one of them ASCII-only and
anchored, where the libraries' regexes read ``$`` as "end, or before a final newline"), or the
library's verdict is wrapped (``idn-hostname``, ``idn-email``, the URI and IRI formats).
``iri``/``iri-reference`` are checked here instead of by rfc3987-syntax (a lark parser, ~50 ms
per string measured): the IRI is mapped to a URI as RFC 3987 §3.1 says (non-ASCII characters,
which must be ``ucschar``, or ``iprivate`` in the query, percent-encoded as UTF-8) and the URI
is checked by RFC 3986. ``regex`` is ``re.compile`` as in jsonschema, with what else it raises
on a hostile string (a RecursionError for 5,000 nested groups, an OverflowError) a failed
check, and its warnings (``FutureWarning: Possible nested set``) kept quiet.
``tests/unit/test_grammar_formats.py`` holds every checker to the test suite (2,670 instances).
"""

from __future__ import annotations

import functools
import re
import warnings
from typing import Any
from urllib.parse import quote

from localllm.grammar.bounded import spend
from localllm.grammar.pattern import check as check_regex
from localllm.grammar.pattern import python_pattern

__all__ = ["ASSERTED", "SUPERSETS", "format_checker", "meta_format_checker", "missing_formats"]

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


_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
#: a pattern (ECMA-262) that every string a format's check accepts matches, in every draft, and
#: whether it matches only those (exact). What tells a format's strings from another's, and
#: what the grammar compiler negates a format with: exact, or (noted) the strings outside a
#: superset, fewer than the format rejects. tests/unit/test_grammar_formats.py holds each to
#: the JSON-Schema-Test-Suite's instances, and the exact ones to a sweep of near-misses.
SUPERSETS: dict[str, tuple[str, bool]] = {
    "date": ("^[0-9]{4}-[0-9]{2}-[0-9]{2}$", False),
    "time": ("^[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\\.[0-9]+)?(?:[Zz]|[+-][0-9]{2}:[0-9]{2})$", False),
    "date-time": (
        "^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\\.[0-9]+)?(?:[Zz]|[+-][0-9]{2}:[0-9]{2})$",
        False,
    ),
    "duration": ("^P[0-9YMWDTHS]+$", False),
    "uuid": ("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", True),
    "ipv4": (f"^(?:{_OCTET}\\.){{3}}{_OCTET}$", True),
    "ipv6": ("^[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*$", False),
    "hostname": ("^[A-Za-z0-9-]+(?:\\.[A-Za-z0-9-]+)*$", False),
    "email": ("@", False),
    "idn-email": ("@", False),
    "uri": ("^[A-Za-z][A-Za-z0-9+.-]*:", False),
    "iri": ("^[A-Za-z][A-Za-z0-9+.-]*:", False),
    "json-pointer": ("^(?:/[\\s\\S]*)?$", False),
    "relative-json-pointer": ("^[0-9]", False),
}


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
    """``cls.FORMAT_CHECKER`` (the draft's formats) with the IRI formats checked fast,
    ``regex`` checked without a raw exception or a warning, and the formats whose checking
    libraries admit what the JSON-Schema-Test-Suite calls invalid (or refuse what it calls
    valid) checked here, as their RFCs' grammars say (:data:`_STRICT`)."""
    from localllm import _jsonschema

    _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
    import jsonschema

    checker = jsonschema.FormatChecker([])
    checker.checkers = dict(meta_format_checker(cls).checkers)  # regex read as patterns are
    strict = dict(_STRICT)
    if "idn-hostname" not in checker.checkers:  # drafts 4 and 6 know no IDNA: RFC 1123 alone
        strict["hostname"] = functools.partial(_is_hostname, idna_aware=False)
    for name, check in strict.items():
        if name in checker.checkers:  # only the formats this draft has
            checker.checkers[name] = (_strings_only(check), ())
    if "idn-hostname" in checker.checkers:
        idn_hostname = _idn_hostname(_verdict(checker.checkers["idn-hostname"]))
        checker.checkers["idn-hostname"] = (_strings_only(idn_hostname), ())
        if "idn-email" in checker.checkers:
            checker.checkers["idn-email"] = (_strings_only(_idn_email(idn_hostname)), ())
    try:
        import rfc3986_validator  # noqa: F401
    except ImportError:
        return checker
    for name, rule in (("iri", "URI"), ("iri-reference", "URI_reference")):
        if name in checker.checkers:
            checker.checkers[name] = (_iri_checker(rule), ())
    for name in ("uri", "uri-reference", "iri", "iri-reference"):
        if name in checker.checkers:
            checker.checkers[name] = (_strings_only(_uri_host_checked(_verdict(checker.checkers[name]))), ())
    return checker


def _verdict(entry: tuple[Any, Any]) -> Any:
    """A jsonschema checker entry (function, the exceptions that mean "no") as a predicate."""
    check, raises = entry

    def verdict(text: str) -> bool:
        try:
            return bool(check(text))
        except raises:
            return False

    return verdict


def _strings_only(check: Any) -> Any:
    """A format constrains strings only: any other value passes."""

    def checked(instance: object) -> bool:
        return not isinstance(instance, str) or bool(check(instance))

    return checked


# RFC 3339 §5.6 (the T and Z in either case, as its note allows; a leap second only where
# UTC reads 23:59)
_TIME = re.compile(
    r"([01][0-9]|2[0-3]):([0-5][0-9]):([0-5][0-9]|60)(?:\.[0-9]+)?(?:[Zz]|([+-])([01][0-9]|2[0-3]):([0-5][0-9]))"
)
_DATE = re.compile(r"([0-9]{4})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])")


def _is_time(text: str) -> bool:
    found = _TIME.fullmatch(text)
    if found is None:
        return False
    hour, minute, second, sign, off_hour, off_minute = found.groups()
    if second != "60":
        return True
    offset = (int(off_hour) * 60 + int(off_minute)) * (1 if sign == "+" else -1) if sign else 0
    return (int(hour) * 60 + int(minute) - offset) % 1440 == 23 * 60 + 59


def _is_date(text: str) -> bool:
    found = _DATE.fullmatch(text)
    if found is None:
        return False
    year, month, day = (int(part) for part in found.groups())
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    return day <= (31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)[month - 1]


def _is_date_time(text: str) -> bool:
    return text[10:11] in ("T", "t") and _is_date(text[:10]) and _is_time(text[11:])


# RFC 3339 appendix A: whole numbers, each part followed only by the next smaller ones
_DURATION = re.compile(
    r"P(?:(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)(?:T(?:[0-9]+S|[0-9]+M(?:[0-9]+S)?"
    r"|[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?))?|T(?:[0-9]+S|[0-9]+M(?:[0-9]+S)?|[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?)|[0-9]+W)"
)
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
# RFC 6901 after a non-negative integer, or "#" (draft-handrews-relative-json-pointer)
_RELATIVE_POINTER = re.compile(r"(?:0|[1-9][0-9]*)(?:#|(?:/(?:[^/~]|~[01])*)*)")
_LDH_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def _is_hostname(text: str, *, idna_aware: bool = True) -> bool:
    """RFC 1123 labels, no trailing dot; ``idna_aware`` (draft 7 on): a label with ``--`` in
    its 3rd and 4th places must be a valid IDNA A-label (RFC 5890 §2.3.1, RFC 5891 §4.2.3.1)."""
    if not text or len(text) > 253 or not text.isascii():
        return False
    for label in text.split("."):
        if _LDH_LABEL.fullmatch(label) is None:
            return False
        if idna_aware and label[2:4] == "--" and not _is_a_label(label):
            return False
    return True


def _is_a_label(label: str) -> bool:
    try:
        import idna

        idna.decode(label.lower())
    except ImportError:
        return label[:4].lower() == "xn--"
    except (UnicodeError, ValueError):  # idna.IDNAError is a UnicodeError
        return False
    return True


# RFC 5321 §4.1.2 (RFC 6531 §3.3 adds any non-ASCII character to atext and qtext)
_ATEXT = "A-Za-z0-9!#$%&'*+/=?^_`{|}~-"
_LOCAL = re.compile(rf"[{_ATEXT}]+(?:\.[{_ATEXT}]+)*|\"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\[\x20-\x7e])*\"")
_IDN_LOCAL = re.compile(
    rf"[\x80-\U0010ffff{_ATEXT}]+(?:\.[\x80-\U0010ffff{_ATEXT}]+)*"  # _ATEXT ends with "-": last
    r'|"(?:[\x20\x21\x23-\x5b\x5d-\x7e\x80-\U0010ffff]|\\[\x20-\x7e\x80-\U0010ffff])*"'
)


def _address_literal(domain: str) -> bool | None:
    """An RFC 5321 address literal's verdict (``[1.2.3.4]``, ``[IPv6:::1]``); None when
    ``domain`` is not one."""
    if not (domain.startswith("[") and domain.endswith("]")):
        return None
    import ipaddress

    inner = domain[1:-1]
    try:
        if inner[:5].lower() == "ipv6:":
            ipaddress.IPv6Address(inner[5:])
        else:
            ipaddress.IPv4Address(inner)
    except ValueError:
        return False
    return True


def _is_email(text: str) -> bool:
    local, at, domain = text.rpartition("@")
    if not at or len(local.encode()) > 64 or _LOCAL.fullmatch(local) is None:
        return False
    literal = _address_literal(domain)
    return literal if literal is not None else _is_hostname(domain)


def _idn_email(idn_hostname: Any) -> Any:
    import unicodedata

    def is_idn_email(text: str) -> bool:
        local, at, domain = text.rpartition("@")
        if not at or _IDN_LOCAL.fullmatch(local) is None:
            return False
        literal = _address_literal(domain)
        # the test suite holds a domain not in NFC valid here, though not as an idn-hostname
        return literal if literal is not None else bool(idn_hostname(unicodedata.normalize("NFC", domain)))

    return is_idn_email


_DOTS = ".\u3002\uff0e\uff61"  # the label separators of IDNA2008 (RFC 3490 §3.1)


def _idn_hostname(check: Any) -> Any:
    """idna's verdict, and: no trailing dot (any of the four), and in a Bidi domain name
    (one with a right-to-left or Arabic-number character) every label meets the Bidi Rule
    (RFC 5893 §2), not only the right-to-left ones, as idna checks."""

    def is_idn_hostname(text: str) -> bool:
        if not text or text[-1] in _DOTS or not check(text):
            return False
        import unicodedata

        import idna

        labels = re.split(f"[{_DOTS}]", text)
        try:
            labels = [idna.decode(label) if label[:4].lower() == "xn--" else label for label in labels]
            if any(unicodedata.bidirectional(ch) in ("R", "AL", "AN") for label in labels for ch in label):
                for label in labels:
                    idna.check_bidi(label, check_ltr=True)
        except (UnicodeError, ValueError):
            return False
        return True

    return is_idn_hostname


#: what a URI's authority is up to its host: the IP literal, if the host is one
_IP_LITERAL = re.compile(r"(?:[A-Za-z][A-Za-z0-9+.-]*:)?//(?:[^/?#@\[\]]*@)?\[([^\]]*)\]")
_IP_FUTURE = re.compile(r"[vV][0-9A-Fa-f]+\.[A-Za-z0-9._~!$&'()*+,;=:-]+")


def _uri_host_checked(check: Any) -> Any:
    """``check`` (rfc3986-validator's, or the IRI checker on it), and: no control character,
    space or DEL anywhere (its regexes read ``$`` as "end, or before a final newline"); an
    IPv6 literal read as the ``ipv6`` format reads one (no leading zero in an embedded IPv4
    part); an IPvFuture's ``v`` in either case (RFC 3986 §3.2.2)."""

    def checked(text: str) -> bool:
        if any(ord(ch) < 0x21 or ord(ch) == 0x7F for ch in text):
            return False
        found = _IP_LITERAL.match(text)
        if found is not None:
            inner = found.group(1)
            if _IP_FUTURE.fullmatch(inner):
                text = text[: found.start(1)] + "v" + text[found.start(1) + 1 :]
            else:
                import ipaddress

                try:
                    ipaddress.IPv6Address(inner)
                except ValueError:
                    return False
        return bool(check(text))

    return checked


_VARCHAR = "(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2})"
_VARSPEC = rf"{_VARCHAR}+(?:\.{_VARCHAR}+)*(?::[1-9][0-9]{{0,3}}|\*)?"
_EXPRESSION = re.compile(rf"[+#./;?&=,!@|]?{_VARSPEC}(?:,{_VARSPEC})*")
# RFC 6570 §2.1 literals, the apostrophe included (as the JSON-Schema-Test-Suite reads it)
_LITERAL = frozenset(chr(c) for c in (0x21, 0x23, 0x24, *range(0x26, 0x3C), 0x3D, *range(0x3F, 0x5C), 0x5D, 0x5F))
_LITERAL |= frozenset(chr(c) for c in (*range(0x61, 0x7B), 0x7E))
_HEX2 = re.compile(r"[0-9A-Fa-f]{2}")


def _is_uri_template(text: str) -> bool:
    """RFC 6570 §2 (level 4): literals, percent-encodings and ``{…}`` expressions, in one pass."""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "{":
            end = text.find("}", i)
            if end < 0 or _EXPRESSION.fullmatch(text, i + 1, end) is None:
                return False
            i = end + 1
        elif ch == "%":
            if _HEX2.fullmatch(text, i + 1, i + 3) is None:
                return False
            i += 3
        elif ch in _LITERAL or (ord(ch) >= 0x80 and _ucschar(ord(ch), in_query=True)):  # ucschar, iprivate
            i += 1
        else:
            return False
    return True


#: the formats checked here instead of by a library, as their RFCs' grammars say (all ASCII)
_STRICT: dict[str, Any] = {
    "date": _is_date,
    "time": _is_time,
    "date-time": _is_date_time,
    "duration": _DURATION.fullmatch,
    "email": _is_email,
    "hostname": _is_hostname,
    "uuid": _UUID.fullmatch,
    "relative-json-pointer": _RELATIVE_POINTER.fullmatch,
    "uri-template": _is_uri_template,
}


def _is_regex(instance: object) -> bool:
    """True, or ``re.error`` (jsonschema keeps it as the error's cause) naming why ``instance``
    is not a pattern :mod:`localllm.grammar.pattern` reads (ECMA-262's ``\\cX``, ``\\p{…}``,
    named groups and variable-width lookbehinds included)."""
    if not isinstance(instance, str):
        return True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            # re reads 0.5-3 µs a character of it (a \p{L} is 1,678): a step of the running check
            # for every 4 (100 answers of 30 \p{L} each, 19 KB, took 17 s, 2.9 s with \p{L} read faster)
            spend(len(python_pattern(instance)) // 4)
            check_regex(instance)
        except (RecursionError, OverflowError, MemoryError) as exc:
            raise re.error(f"it cannot be compiled ({type(exc).__name__})") from None
    return True


@functools.lru_cache(maxsize=16)
def meta_format_checker(cls: Any) -> Any:
    """``cls.FORMAT_CHECKER`` with ``regex`` read as :func:`format_checker` reads it: what a
    schema's own keywords are checked with against its meta-schema."""
    from localllm import _jsonschema

    _jsonschema.prepare()  # before jsonschema's first import: see localllm/_jsonschema.py
    import jsonschema

    checker = jsonschema.FormatChecker([])
    checker.checkers = dict(cls.FORMAT_CHECKER.checkers)
    if "regex" in checker.checkers:
        checker.checkers["regex"] = (_is_regex, (re.error,))
    return checker


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
