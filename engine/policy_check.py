"""``portcullis policy check``: every check a bundle must pass before the gateway serves
it, run offline over the bundle's files, reporting every problem at once, each with
the file (and line) to edit and, where the fix is known, a hint.

The checks are activation's own (engine/activation_checks.py), run to the end instead
of to the first problem, after the ones done when files are read: the signature (when
keys are given) and the bundle's layout. What activation knows as a data field
(``catalog.models.x.targets[0]``) is mapped to the data file that holds it and the
line of that field.
"""

from __future__ import annotations

import ast
import base64
import datetime as dt
import json
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from portcullis.engine.activation_checks import CONTEXT_FIT_RULE, DECISION_RULE, INDEX_RULE, CheckRun, check_bundle
from portcullis.engine.bundle import DATA_FILES, BundleError, parse_bundle
from portcullis.engine.documents import load_yaml
from portcullis.engine.policy_lint import rule_lines
from portcullis.engine.rego import PolicyError, error_location, error_summary, parse_module
from portcullis.engine.signing import SIGNATURES_FILE, SignatureError, VerificationKey, verify_files
from portcullis.engine.suggestions import closest_names

# What each check verified, in the order they run (the catalog check's problems are told
# apart: catalog, prices, providers).
LABELS = {
    "signature": "the signature verifies with a given key",
    "layout": "bundle layout: .manifest, roots, UTF-8 Rego, readable data files",
    "data": "data.portcullis is there",
    "portability": "the data reads alike in OPA and regorus",
    "schema": "the data matches schemas/bundle-data.schema.json",
    "catalog": "catalog consistency: aliases, fallbacks, regions",
    "prices": "a price in effect for every route",
    "providers": "every target names a configured provider",
    "pii detectors": "PII policies ask only for detectors the gateway runs",
    "integrity": "integrity policies name rules the bundle defines",
    "intent": "intent routers name served models, tiers and keyword sets",
    "budget tiers": "budget tiers name teams, budget rules and served models",
    "patterns": "integrity patterns compile in regorus and in RE2 (OPA's dialect)",
    "rego": "the Rego modules compile",
    "tests": "the bundle's own *_test.rego tests pass",
    "rule paths": "no rule shares its path with data",
    "index": "the per-bundle index (compiled_index) evaluates to JSON data",
    "plans": "the decision entry point returns well-formed plans",
    "context fit": "the context-fit entry point answers one verdict per target",
}
_CATALOG_PARTS = ("catalog", "prices", "providers")
_ENTRY_POINT_OF = {"index": INDEX_RULE, "plans": DECISION_RULE, "context fit": CONTEXT_FIT_RULE}  # the rule a check evaluates
_QUOTED = r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")"


@dataclass(frozen=True)
class Finding:
    check: str
    message: str
    file: str | None = None  # bundle-relative
    line: int | None = None
    hint: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "file": self.file, "line": self.line, "message": self.message, "hint": self.hint}


@dataclass
class Report:
    findings: list[Finding] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    revision: str | None = None
    signed_by: str | None = None

    @property
    def ok(self) -> bool:
        return not self.findings


@dataclass(frozen=True)
class Context:
    """What the hints name: the day prices must be in effect, the configuration and its
    providers (None: no configuration was found), the PII detectors it runs."""

    today: dt.date
    config: str | None = None
    providers: Collection[str] | None = None
    detectors: Collection[str] | None = None


def check_files(files: Mapping[str, bytes], keys: Sequence[VerificationKey] | None, context: Context) -> Report:
    """Every check over a bundle's files (bundle-relative name -> content). ``keys``
    None: signatures are not checked (a signed bundle is read as if unsigned)."""
    report = Report()
    if keys is None:
        signed = SIGNATURES_FILE in files
        report.skipped["signature"] = "no public key given (--public-key or the configuration's policy.public_keys)" + (
            "; the bundle is signed, which a gateway without policy.public_keys refuses" if signed else ""
        )
    else:
        report.findings += _signature_findings(files, keys, report)
    unsigned = {name: content for name, content in files.items() if name != SIGNATURES_FILE}
    broken = _unreadable_files(unsigned)
    bundle = None
    if not broken:
        try:
            bundle = parse_bundle(unsigned, [])  # the signature, if any, was judged above
        except BundleError as error:
            broken = [_layout_finding(str(error), unsigned)]
    if bundle is None:
        report.findings += broken + _syntax_findings(unsigned)  # Rego parses without the data: its errors are named too
        report.skipped.update({check: "the files cannot be read as a bundle" for check in LABELS if check not in ("signature", "layout")})
        return report
    report.passed.append("layout")
    report.revision = bundle.revision
    run = check_bundle(bundle, context.providers, context.today, context.detectors)
    report.findings += _findings(run, bundle.data.get("portcullis"), unsigned, bundle.modules, context)
    _summarise(run, report, context, bool(bundle.tests))
    return report


def signature_key_id(files: Mapping[str, bytes]) -> str | None:
    """The key id a bundle's signature names (for keys given without one), if any."""
    try:
        token = json.loads(files[SIGNATURES_FILE])["signatures"][0]
        header = json.loads(_unb64(token.split(".")[0]))
        return str(header.get("kid")) if header.get("kid") else None
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        return None


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _signature_findings(files: Mapping[str, bytes], keys: Sequence[VerificationKey], report: Report) -> list[Finding]:
    errors: list[str] = []
    # keys given on the command line may share an id: each is tried on its own
    for candidates in [list(keys)] + ([[key] for key in keys] if len({key.key_id for key in keys}) < len(keys) else []):
        try:
            report.signed_by = verify_files(files, candidates)
            report.passed.append("signature")
            return []
        except SignatureError as error:
            errors.append(str(error))
    message = errors[-1] if len(errors) > 1 else errors[0]
    named = re.search(r"file (\S+) (?:does not match|is not covered|cannot be parsed)|signed file (\S+) is missing", message)
    file = (named[1] or named[2]) if named else SIGNATURES_FILE
    return [Finding("signature", message, file, None, _signature_hint(message))]


def _signature_hint(message: str) -> str:
    resign = "re-sign the bundle (portcullis policy sign BUNDLE --signing-key KEY.pem --key-id ID)"
    if "is not signed" in message:
        return f"sign it: {resign.removeprefix('re-sign the bundle ')}"
    if "does not match its signed digest" in message or "is not covered" in message or "is missing from the bundle" in message:
        return f"the files changed after signing: restore them, or {resign}"
    if "does not verify" in message:
        return f"the bundle was signed by another key than the one given, or its signature was edited: {resign} with the matching key"
    if "is not among" in message:
        return "give the signer's public key (--public-key ID=FILE, or policy.public_keys in the configuration)"
    return ""


def _unreadable_files(files: Mapping[str, bytes]) -> list[Finding]:
    """Every data file that does not parse, each with its line (bundle.py stops at the first)."""
    findings = []
    for name, content in sorted(files.items()):
        if name.rsplit("/", 1)[-1] not in DATA_FILES:
            continue
        try:
            json.loads(content) if name.endswith(".json") else load_yaml(content)
        except json.JSONDecodeError as error:
            findings.append(Finding("layout", f"{name} is not valid JSON: {error.msg}", name, error.lineno, ""))
        except (yaml.YAMLError, ValueError) as error:
            mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
            findings.append(Finding("layout", f"{name} is not valid YAML: {str(error).splitlines()[0]}", name, mark.line + 1 if mark else None, ""))
    return findings


def _layout_finding(message: str, files: Mapping[str, bytes]) -> Finding:
    file = next((name for name in sorted(files, key=len, reverse=True) if message.startswith(name)), None)
    if message.startswith(".manifest"):
        file = ".manifest"
    hint = "put the file under one of the manifest's roots, or add its root to .manifest" if "outside the manifest roots" in message else ""
    return Finding("layout", message, file, None, hint)


def _syntax_findings(files: Mapping[str, bytes]) -> list[Finding]:
    findings = []
    for name, content in sorted(files.items()):
        if name.endswith(".rego"):
            try:
                parse_module(name, content.decode("utf-8", "replace"))
            except PolicyError as error:
                where = error_location(str(error))
                findings.append(Finding("rego", f"syntax error: {error_summary(str(error))}", name, where[1] if where else None))
    return findings


def _findings(run: CheckRun, data: Any, files: Mapping[str, bytes], modules: Mapping[str, str], context: Context) -> list[Finding]:
    located = _DataFiles(files)
    rules: dict[str, tuple[str, int]] | None = None
    findings = []
    for problem in run.problems:
        check = _catalog_part(problem.message) if problem.check == "catalog" else problem.check
        file, line = problem.file, problem.line
        if file is None and problem.check in ("rule paths", *_ENTRY_POINT_OF):
            rules = rule_lines(modules) if rules is None else rules
            named = re.match(r"rule (\S+) shares", problem.message)
            rule = named[1] if named else _ENTRY_POINT_OF.get(problem.check, "")
            file, line = rules.get(rule, (None, None))
        elif file is None:
            path = problem.data_path if problem.data_path is not None else _field_path(problem.message, data)
            file, line = located.locate(path) if path is not None else (None, None)
        message = problem.message
        if "-->" in message:  # a regorus error: its own words; the position is the finding's
            message = f"{message.split(':', 1)[0]}: {error_summary(message)}"
        findings.append(Finding(check, message, file, line, problem.hint or _hint(check, problem.message, data, located, context)))
    return findings


def _summarise(run: CheckRun, report: Report, context: Context, has_tests: bool) -> None:
    failed = {finding.check for finding in report.findings}
    for check in LABELS:
        source = "catalog" if check in _CATALOG_PARTS else check  # catalog_problems checks all three
        if check == "providers" and context.providers is None and source not in run.skipped:
            report.skipped[check] = "no configuration found (give --config): targets' providers are not judged"
        elif check == "pii detectors" and context.detectors is None and source not in run.skipped:
            report.skipped[check] = "no configuration found (give --config): the PII detectors it enables are unknown"
        elif source in run.skipped:
            report.skipped[check] = run.skipped[source]
        elif check == "tests" and not has_tests and check not in failed:
            report.skipped[check] = "the bundle has no *_test.rego"
        elif source in run.passed or (source in {p.check for p in run.problems} and check not in failed):
            report.passed.append(check)
    report.passed.sort(key=list(LABELS).index)


def _catalog_part(message: str) -> str:
    if "is not a configured provider" in message or re.search(r"but provider .* calls region", message):
        return "providers"
    return "prices" if "no price in effect" in message else "catalog"


def _field_path(message: str, data: Any) -> tuple[str | int, ...] | None:
    """The data field a message starts with (``catalog.models.a.b[1m].targets[0]: …``),
    read against the data itself, since keys may hold dots and brackets; or the entry a
    message names (``intent router 'x'``)."""
    for pattern, where in _NAMED:
        found = re.match(pattern, message)
        if found:
            return where(data, ast.literal_eval(found[1]) if found.groups() else "")
    text, node, path, i = message.removeprefix("data.portcullis."), data, [], 0
    while True:
        if isinstance(node, list):
            found = re.match(r"\[(\d+)\]", text[i:])
            if not found or int(found[1]) >= len(node):
                break
            path.append(int(found[1]))
            node, i = node[int(found[1])], i + found.end()
        elif isinstance(node, Mapping):
            if path and text.startswith(".", i):
                i += 1
            quoted = re.match(r"\[" + _QUOTED + r"\]", text[i:]) if path else None
            key = ast.literal_eval(quoted[1]) if quoted else None
            if quoted and key in node:
                i += quoted.end()
            else:
                ends = ("", ".", "[", ":", " ")
                key = max(
                    (k for k in node if isinstance(k, str) and text.startswith(k, i) and text[i + len(k) : i + len(k) + 1] in ends), key=len, default=None
                )
                if key is None:
                    break
                i += len(key)
            path.append(key)
            node = node[key]
        else:
            break
    return tuple(path) or None


def _by_field(kinds: tuple[str, ...], attribute: str) -> Callable[[Any, str], tuple[str | int, ...]]:
    def where(data: Any, name: str) -> tuple[str | int, ...]:
        section = (data or {}).get(kinds[0]) or {}
        for kind in kinds[1:]:
            for index, entry in enumerate(section.get(kind) or []):
                if isinstance(entry, Mapping) and entry.get(attribute) == name:
                    return (kinds[0], kind, index)
        return (kinds[0],)

    return where


_NAMED: list[tuple[str, Callable[[Any, str], tuple[str | int, ...]]]] = [
    (r"intent router " + _QUOTED, _by_field(("intent", "routers"), "name")),
    (r"intent keyword_sets", lambda data, _: ("intent", "keyword_sets")),
    (r"integrity policy " + _QUOTED, lambda data, name: ("integrity", "policies", name)),
    (r"pii policy " + _QUOTED, lambda data, name: ("pii", "policies", name)),
    (r"integrity(?:: injection)? rule " + _QUOTED, _by_field(("integrity", "injection_rules", "tool_rules"), "id")),
]


class _DataFiles:
    """Which data file holds a field of data.portcullis, and on which line."""

    def __init__(self, files: Mapping[str, bytes]) -> None:
        self._files = {
            tuple(part for part in name.split("/")[:-1] if part): (name, content) for name, content in files.items() if name.rsplit("/", 1)[-1] in DATA_FILES
        }

    def file_of(self, path: tuple[str | int, ...]) -> str | None:
        return self.locate(path)[0]

    def locate(self, path: tuple[str | int, ...]) -> tuple[str | None, int | None]:
        full = ("portcullis", *path)
        mounts = [mount for mount in self._files if full[: len(mount)] == mount]
        if not mounts:
            return None, None
        mount = max(mounts, key=len)
        name, content = self._files[mount]
        try:
            node = yaml.compose(content, Loader=yaml.SafeLoader)  # JSON too: positions are all this reads
        except yaml.YAMLError:
            return name, None
        line = node.start_mark.line + 1 if node is not None else None
        for part in full[len(mount) :]:
            if isinstance(node, yaml.MappingNode):
                entry = next(((key, value) for key, value in node.value if key.value == str(part)), None)
                if entry is None:
                    break
                line, node = entry[0].start_mark.line + 1, entry[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                break
        return name, line


def _hint(check: str, message: str, data: Any, located: _DataFiles, context: Context) -> str:
    catalog = (data or {}).get("catalog") or {}
    if found := re.search(r"no price in effect for (\S+) in region (\S+?);", message):
        region = found[2] if found[2] != "None" else "none"
        where = located.file_of(("catalog", "prices")) or "the catalog"
        return f"add a price for {found[1]} (region {region}, or none for every region) effective on or before {context.today} to {where}, under prices"
    if found := re.search(r"'([^']+)' is not a configured provider", message):
        names = ", ".join(sorted(context.providers or ())) or "none"
        return f"add a provider named {found[1]!r} to {context.config or 'the configuration'} (providers), or use one of its providers: {names}"
    if found := re.search(r"but provider '([^']+)' calls region '([^']+)'", message):
        return f"set the target's region to {found[2]!r}, or route it through a provider in its region"
    if found := re.search(r"points at unknown model '([^']+)'", message):
        guesses = closest_names(found[1], list(catalog.get("models") or ()))
        return "point the alias at a model of catalog.models" + (f" (closest: {', '.join(guesses)})" if guesses else "")
    hints = {
        "shadows the canonical model": "rename or remove the alias: a canonical model ID always names that model",
        "is not another known model": "name another model of catalog.models as the fallback, or remove it",
        "cross-region inference profile": "declare regions: [...] on the target, every region the profile may route to",
        "does not include the target's region": "add the target's region to its regions",
        "has not enabled": "enable the detector in the configuration's pii section, or remove it from the policy",
        "which tool_rules does not define": "define the rule under integrity.tool_rules, or remove it from the policy's tools.deny",
        "is not defined in tenants": "add the team under tenants.teams, or remove it here",
    }
    hint = next((hint for text, hint in hints.items() if text in message), "")
    return hint or {
        "tests": "portcullis policy test BUNDLE shows the failing statement and its values",
        "plans": "data.portcullis.decision must return a plan matching schemas/decision-plan.schema.json for every team and model",
        "context fit": "data.portcullis.context_fit_verdicts must return one {fits, reasons} verdict per input target",
        "rule paths": "rename the rule, or move the data off its path",
        "index": "compiled_index must be JSON data: objects and arrays, no sets",
    }.get(check, "")


def report_json(report: Report) -> dict[str, Any]:
    return {
        "ok": report.ok,
        "revision": report.revision,
        "signed_by": report.signed_by,
        "findings": [finding.as_dict() for finding in report.findings],
        "passed": report.passed,
        "skipped": report.skipped,
    }


def algorithm_of(public_key_pem: bytes) -> str | None:
    """The JWS algorithm a PEM public key verifies: RS256 for RSA, ES256 for P-256."""
    try:
        key = serialization.load_pem_public_key(public_key_pem)
    except ValueError:
        return None
    if isinstance(key, rsa.RSAPublicKey):
        return "RS256"
    if isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1":
        return "ES256"
    return None
