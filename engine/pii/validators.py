"""The rules that confirm a candidate: checksums, registries and format rules of each
structured identifier, as their issuers define them."""

from __future__ import annotations

import datetime as dt
import ipaddress
import re


def luhn_valid(digits: str) -> bool:
    total = 0
    for i, char in enumerate(reversed(digits)):
        d = ord(char) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


# Issuer prefixes of the major schemes (Visa, Mastercard incl. 2-series, Amex, Diners,
# Discover, JCB, UnionPay, Maestro): a Luhn-valid number with another prefix is far
# more often an order number than a card.
_CARD_PREFIX = re.compile(r"4|5[1-5]|2[2-7]|3[47]|3[068]|6[0245]|35|62|67")


# How cards are printed when grouped: 4-4-4-4(-3), Amex 4-6-5, Diners 4-6-4. A
# Luhn-valid number grouped otherwise (a French SIRET is 3-3-3-5) is something else.
_CARD_GROUPS = {(4, 4, 4, 4), (4, 4, 4, 4, 3), (4, 6, 5), (4, 6, 4), (4, 4, 4, 1), (4, 4, 4, 2), (4, 4, 4, 3)}


def card_valid(text: str) -> bool:
    parts = re.split(r"[ .-]", text)
    groups = tuple(len(group) for group in parts)
    digits = "".join(parts)
    if len(groups) > 1 and (groups not in _CARD_GROUPS or len(set(re.findall(r"[ .-]", text))) > 1):
        return False
    return 13 <= len(digits) <= 19 and bool(_CARD_PREFIX.match(digits)) and luhn_valid(digits)


# ISO 13616 lengths of the registry's countries.
_IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29, "BY": 28, "CH": 21,
    "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FO": 18, "FR": 27,
    "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26,
    "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "MC": 27, "MD": 24,
    "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18, "NO": 15, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29,
    "RO": 24, "RS": 22, "SA": 24, "SC": 31, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "ST": 25, "SV": 28, "TL": 23, "TN": 24,
    "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20,
}  # fmt: skip


def iban_valid(compact: str) -> bool:
    if _IBAN_LENGTHS.get(compact[:2]) != len(compact):
        return False
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(c, 36)) for c in rearranged)) % 97 == 1


_RRN_WEIGHTS = (2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5)


def kr_rrn_valid(text: str, sexes: str = "1234") -> bool:
    """Birth date, sex/century digit 1–4 and the check digit. Numbers issued since
    October 2020 no longer carry a check digit; only a label finds those
    (``kr_rrn_labelled``)."""
    digits = text.replace("-", "")
    if _kr_rrn_birth(digits, sexes) is None:
        return False
    total = sum(int(d) * w for d, w in zip(digits[:12], _RRN_WEIGHTS, strict=True))
    return (11 - total % 11) % 10 == int(digits[12])


_CENTURY = {"1": 1900, "2": 1900, "3": 2000, "4": 2000, "5": 1900, "6": 1900, "7": 2000, "8": 2000}
_RANDOM_SERIALS_SINCE = dt.date(2020, 10, 1)


def _kr_rrn_birth(digits: str, sexes: str) -> dt.date | None:
    if digits[6] not in sexes:
        return None
    try:
        return dt.date(_CENTURY[digits[6]] + int(digits[0:2]), int(digits[2:4]), int(digits[4:6]))
    except ValueError:
        return None


def kr_rrn_labelled(text: str) -> bool:
    """A number its label calls an RRN: a citizen's (sex/century digit 1–4) or a
    registered foreigner's (5–8), with a real birth date and its check digit, or
    without one when born since October 2020, when serials became random."""
    digits = text.replace("-", "")
    birth = _kr_rrn_birth(digits, "12345678")
    return birth is not None and (birth >= _RANDOM_SERIALS_SINCE or kr_rrn_valid(digits, "12345678"))


def jp_my_number_valid(text: str) -> bool:
    digits = re.sub(r"[ .-]", "", text)
    body = [int(d) for d in digits[:11]]
    total = sum(p * (n + 1 if n <= 6 else n - 5) for n, p in enumerate(reversed(body), start=1))
    remainder = total % 11
    return (0 if remainder <= 1 else 11 - remainder) == int(digits[11])


def ssn_valid(text: str) -> bool:
    digits = re.sub(r"[ .-]", "", text)
    area, group, serial = digits[:3], digits[3:5], digits[5:]
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


def ipv4_valid(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def ipv6_valid(text: str) -> bool:
    if text != "::1" and sum(c.isalnum() for c in text) < 2:  # "::" alone, or "a::" in C++-like text
        return False
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def phone_valid(text: str) -> bool:
    digits = sum(c.isdigit() for c in text)
    return 8 <= digits <= 15


def credential_like(value: str) -> bool:
    """A value assigned to a secret-sounding name is a credential when it looks random:
    letters and digits both, not a dotted name (``tokens=request.max_tokens``) nor a
    call (``token=get_token()``)."""
    if not (any(c.isdigit() for c in value) and any(c.isalpha() for c in value)):
        return False
    return re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+|[A-Za-z_][\w.]*\(.*", value) is None


def secret_valid(text: str) -> bool:
    if text.startswith("-----BEGIN"):
        return True
    # A run of one repeated character is a placeholder (AKIAXXXXXXXXXXXXXXXX), a "$VAR"
    # or "{{ var }}" a reference, a URL an endpoint ("token_uri": "https://..."): not keys.
    return re.search(r"(.)\1{7}", text) is None and not text.startswith(("$", "<", "{", "%")) and "://" not in text


def compact(text: str) -> str:
    """A grouped identifier without its separators."""
    return text.replace(" ", "").replace(".", "").replace("-", "")
