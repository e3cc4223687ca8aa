"""Layer E: what the output guard looks for in an answer's text before the client
sees it — the policy prompt's canary, secrets, and URLs that carry data to a host
the policy does not allow — and what each action makes of it."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from portcullis.engine.pii.recognizers import SECRET_VALUE_CHARS, find

CANARY, SECRETS, URLS = "canary", "secrets", "urls"
STRICTNESS = {"withhold": 0, "redact": 1, "flag": 2}
REPLACEMENT = {CANARY: "[removed by gateway policy]", SECRETS: "[secret removed by gateway policy]", URLS: "[link removed by gateway policy]"}

# Also a scheme-relative //host where a markdown target or an img src starts.
_URL = re.compile(r"(?i)(?:\b(?:https?|ftp):(?://|\\\\)|(?:(?<=\]\()|(?<=\]\(<)|(?<==\")|(?<==')|(?<==))//)[^\s<>\"'`)\]]+")
_IMAGE_TARGET = re.compile(r"!\[[^\]\n]{0,400}\]\(\s*<?$")
_IMG_SRC = re.compile(r"(?i)<(?:img|image|video|source|input)\b[^>]{0,400}\b(?:src|srcset|poster|href)\s*=\s*[\"']?(?:[^\"'>]*,\s*)?$")
_IMAGE_REFERENCE = re.compile(r"!\[([^\]\n]{1,400})\](?:\[([^\]\n]{0,100})\])?")
_DEFINITION = re.compile(r"(?m)^ {0,3}\[([^\]\n]{1,100})\]:\s*<?$")
_DATA_VALUE = re.compile(r"[A-Za-z0-9+/=_%.-]{16,}")
_ENCODED = re.compile(r"(?=[^/.]*[a-z])(?=[^/.]*[A-Z])(?=[^/.]*[0-9])[A-Za-z0-9+=_-]{20,}")  # base64-like: a path segment or host label carrying data
_IP_HOST = re.compile(r"^\[?[0-9a-f:.]+\]?$", re.IGNORECASE)
_SECRET_STARTS = ("AKIA", "ASIA", "gh", "github_pat_", "sk-", "sk_", "xox", "AIza", "eyJ", "-----", "glpat-")
_CREDENTIAL_CHARS = re.compile(r"[A-Za-z0-9_+/=.-]+")
_NOT_CREDENTIAL = re.compile(r"[^A-Za-z0-9_+/=.-]")
# A private key's header, or a header still being written that may become one.
_KEY_BLOCK_START = re.compile(r"-----BEGIN(?: [A-Z0-9]+){0,3} PRIVATE KEY|-----BEGIN[A-Z0-9 ]{0,40}$")
_KEY_BLOCK_END = re.compile(r"-----END [A-Z0-9 ]{1,40}-----")
# A secret's name and what joins it to its value, as the secret recogniser reads them.
_SECRET_NAME = re.compile(r"(?i)(?:secret|token|passw|pwd|api.?key|private.?key|access.?key|auth)[A-Za-z0-9_]*[\"'\]]?\s*[:=]\s*[\"'`]?|\bbearer\s+")
_VALUE_END = re.compile(SECRET_VALUE_CHARS.replace("[", "[^", 1))
_SPACE = re.compile(r"\s")
MAX_HELD = 8192  # longer than any secret the recogniser matches: past it, nothing is held


@dataclass(frozen=True)
class Finding:
    kind: str  # canary | secrets | urls
    start: int
    end: int


def inspect(
    text: str, kinds: Iterable[str], canaries: Sequence[str], allowed_hosts: Sequence[Sequence[str]], image_labels: Collection[str] = ()
) -> list[Finding]:
    """Findings in ``text``; ``image_labels`` are reference labels images used earlier
    in the same answer (a stream's text before this window)."""
    wanted = set(kinds)
    found: list[Finding] = []
    if CANARY in wanted:
        for canary in canaries:
            start = text.find(canary)
            while start >= 0:
                found.append(Finding(CANARY, start, start + len(canary)))
                start = text.find(canary, start + 1)
    if SECRETS in wanted:
        found += [Finding(SECRETS, f.start, f.end) for f in find(text, ("SECRET",))]
    if URLS in wanted:
        for match in _URL.finditer(text):
            if suspicious_url(match.group(), _rendered_image(text, match.start(), image_labels), allowed_hosts):
                found.append(Finding(URLS, match.start(), match.end()))
    return sorted(found, key=lambda f: (f.start, -f.end))


def suspicious_url(url: str, markdown_image: bool, allowed_hosts: Sequence[Sequence[str]]) -> bool:
    """A URL to a host the policy does not allow that could carry data out: credentials
    in it, a raw IP host, a query value long enough to hold a secret, an encoded-looking
    path segment or host label — or any markdown image, which a renderer fetches with
    no click. Backslashes read as browsers read them (as "/")."""
    try:
        parts = urlsplit(url.replace("\\", "/"))
        host = (parts.hostname or "").lower()
    except ValueError:
        return url.startswith(("http", "ftp", "HTTP", "FTP"))  # a malformed URL with a scheme is not given the benefit of the doubt
    if allowed_hosts and host and all(any(fnmatch.fnmatchcase(host, pattern.lower()) for pattern in hosts) for hosts in allowed_hosts):
        return False
    if markdown_image or parts.username or parts.password or _IP_HOST.match(host):
        return True
    labels = parts.netloc.rpartition("@")[2].split(":")[0]  # as written: the lowercased hostname hides base64
    return bool(_DATA_VALUE.search(parts.query + parts.fragment) or _ENCODED.search(parts.path) or _ENCODED.search(labels))


def image_labels(text: str) -> set[str]:
    """The reference labels images use in ``text``: ![alt][ref], ![ref][], ![ref]."""
    return {(ref or alt).lower() for alt, ref in _IMAGE_REFERENCE.findall(text)}


def _rendered_image(text: str, start: int, known_labels: Collection[str] = ()) -> bool:
    """Whether the URL at ``start`` is an image a renderer fetches by itself: the
    target of ``![alt](…)``, an ``<img src>``, or the definition of a reference an
    ``![alt][ref]`` uses."""
    before = text[max(0, start - 500) : start]
    if _IMAGE_TARGET.search(before) or _IMG_SRC.search(before):
        return True
    definition = _DEFINITION.search(before)
    if definition is None:
        return False
    label = definition.group(1).lower()
    return label in known_labels or label in image_labels(text)


def apply(text: str, findings: Iterable[Finding], actions: dict[str, str], continued: Collection[Finding] = ()) -> str:
    """The text with every finding whose action is redact replaced; a ``continued``
    finding (the rest of one already replaced) is removed without a second marker."""
    out, at = [], 0
    for finding in findings:
        if actions.get(finding.kind) != "redact" or finding.start < at:
            continue
        out += [text[at : finding.start], "" if finding in continued else REPLACEMENT[finding.kind]]
        at = finding.end
    return "".join(out) + text[at:] if out else text


def held_from(text: str, canaries: Sequence[str]) -> int:
    """Where a stream must hold text back: the trailing word, when it could still grow
    into something the guard looks for (a URL, a secret, a canary), and a private key
    block from its BEGIN line until its END line. Ordinary words are not held, so most
    deltas pass without waiting."""
    block = text.rfind("-----BEGIN", max(0, len(text) - MAX_HELD))
    if block >= 0 and _KEY_BLOCK_START.match(text, block) and not _KEY_BLOCK_END.search(text, block):
        return block
    window = text[-MAX_HELD:]
    space = _SPACE.search(window[::-1])  # the last whitespace, found by C code, however long the word
    if space is None and len(window) == MAX_HELD:
        return len(text)  # a word this long is judged as it is
    start = len(text) - (space.start() if space else len(window))
    word = text[start:]
    if not word:
        return len(text)
    if _could_grow(word, canaries) or _value_still_open(text, start):
        return start
    return len(text)


def _value_still_open(text: str, word_start: int) -> bool:
    """Whether the text ends inside the value of a named secret (``password: …``,
    ``"apiKey":"…``, ``DB_PASSWORD=…``, ``Bearer …``), which the recogniser judges only
    once it is whole."""
    names = list(_SECRET_NAME.finditer(text, max(0, word_start - 64)))
    if not names:
        return False
    value = text[names[-1].end() :]
    return not _VALUE_END.search(value)


def _could_grow(word: str, canaries: Sequence[str]) -> bool:
    lowered = word.lower()
    if "://" in word or "](" in word or "//" in word or lowered.startswith(("http", "www.", "ftp")) or any(p.startswith(lowered) for p in ("https://", "ftp://")):
        return True
    if any(_suffix_prefix(word, canary) for canary in canaries):
        return True
    # A secret may sit after punctuation in the same word: {"key":"AKIA…, token:`ghp_…
    tail = _NOT_CREDENTIAL.split(word)[-1]
    if tail and any(tail.startswith(p) or p.startswith(tail) for p in _SECRET_STARTS):
        return True
    return len(tail) >= 12 and _CREDENTIAL_CHARS.fullmatch(tail) is not None


def _suffix_prefix(word: str, canary: str) -> bool:
    """Some ending of the word starts the canary (or the canary is inside it)."""
    if canary in word:
        return True
    return any(canary.startswith(word[i:]) for i in range(max(0, len(word) - len(canary)), len(word)))
