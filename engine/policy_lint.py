"""``portcullis policy lint``: the traps of this engine, found in a bundle's Rego.

Each rule names a construct that evaluates correctly but costs the gateway dearly
(regorus's cost model) or means one thing in regorus and another in OPA. They read the
parsed AST (engine/rego.py ``parse_module``); comments, which the AST leaves out, are
read as text (``# METADATA`` blocks, suppressions). A finding is silenced by
``# portcullis-lint: ignore <rule-id>[, <rule-id>…]`` on its line or the line above,
best followed by the reason.

"The request path" is every rule the per-request entry points reach (by full path,
by name inside their package, through imports); the load-time ``compiled_index`` is
not on it. Modules with no entry point among them are taken as all on it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from portcullis.engine.activation_checks import ENTRY_POINTS, REQUEST_ENTRY_POINTS
from portcullis.engine.portable import glob_problem, pattern_problem
from portcullis.engine.rego import NON_DETERMINISTIC, PolicyError, error_location, error_summary, parse_module

RULES = {
    "whole-package-import": "`import` of a package (not of a rule) in a module on the request path",
    "catalog-glob-scan": "glob or regex matching while iterating the catalog, in a per-request rule",
    "nondeterministic-builtin": "a clock, random or network builtin (even named in a comment), which turns the decision cache off",
    "glob-wildcard-non-ascii": "a glob.match pattern with ? or [...] (or { } \\), which OPA and regorus match differently",
    "regex-class-differs": "a regex with \\b \\w \\d \\s (or a nested class), which is ASCII in OPA and Unicode in regorus",
    "entry-point-metadata": "an entry point the gateway evaluates without a # METADATA block saying entrypoint: true",
    "syntax-error": "the module does not parse",
}
_MATCHERS = {"glob.match", "regex.match", "regex.find_n", "regex.find_all_string_submatch_n", "regex.split", "regex.replace", "regex.template_match"}
# where each regex builtin takes its pattern (regex.replace's first argument is the text)
_REGEX_PATTERN_ARG = {name: 0 for name in ("regex.match", "regex.is_valid", "regex.split", "regex.find_n", "regex.find_all_string_submatch_n", "re_match")}
_REGEX_PATTERN_ARG["regex.replace"] = 1
_UNICODE_ESCAPES = "bBwWdDsS"  # engine/portable.py refuses the first six in data; \s too here: Rego sees raw input
_SUPPRESSION = re.compile(r"portcullis-lint:\s*ignore\s+([a-z0-9-]+(?:\s*,\s*[a-z0-9-]+)*)")
_NOT_DATA = {"input", "rego", "future"}


@dataclass(frozen=True, order=True)
class LintFinding:
    file: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.rule}: {self.message}"


@dataclass
class _Call:
    name: str  # dotted, as written (`glob.match`, `data.portcullis.lib.covers`, `_local`)
    params: list[Any]
    line: int
    scanning_catalog: bool  # inside a query that iterates the catalog
    ref: tuple[str, ...] | None
    targets: set[tuple[str, ...]] = field(default_factory=set)  # the rules it calls, once resolved


@dataclass
class _Rule:
    path: tuple[str, ...]
    file: str
    line: int
    refs: set[tuple[str, ...]] = field(default_factory=set)  # what it reads; rule paths once resolved
    calls: list[_Call] = field(default_factory=list)

    @property
    def callees(self) -> set[tuple[str, ...]]:
        return {target for call in self.calls for target in call.targets}


@dataclass
class _Module:
    file: str
    source: str
    package: tuple[str, ...]
    imports: list[tuple[tuple[str, ...], str, int]]  # (path without `data`, name it binds, line)
    rules: list[_Rule]
    test: bool


def lint_modules(modules: Mapping[str, str]) -> list[LintFinding]:
    """Every unsuppressed finding of ``modules`` (display name -> Rego source), sorted."""
    parsed: list[_Module] = []
    findings: list[LintFinding] = []
    for name, source in modules.items():
        try:
            parsed.append(_module(name, source, parse_module(name, source)))
        except PolicyError as error:
            where = error_location(str(error))
            findings.append(LintFinding(name, where[1] if where else 1, "syntax-error", error_summary(str(error))))
    served = [module for module in parsed if not module.test]
    definitions: dict[tuple[str, ...], list[_Rule]] = {}  # a function may be defined several times
    for module in served:
        for rule in module.rules:
            definitions.setdefault(rule.path, []).append(rule)
    _resolve(served, definitions.keys())
    request_path = _reachable(definitions, [tuple(entry.split(".")[1:]) for entry in REQUEST_ENTRY_POINTS]) or set(definitions)
    matching = _matching_functions(definitions)
    packages = {module.package for module in served}
    for module in parsed:
        on_request_path = any(rule.path in request_path for rule in module.rules)
        if not module.test:
            if on_request_path:
                findings += _package_imports(module, packages)
            findings += _catalog_scans(module, request_path, matching)
            findings += _nondeterministic(module)
            findings += _entry_point_metadata(module)
        findings += _portability(module)
    return sorted(finding for finding in findings if not _suppressed(finding, modules[finding.file]))


def rule_lines(modules: Mapping[str, str]) -> dict[str, tuple[str, int]]:
    """Where each rule of the modules that parse is first defined: ``data.a.b`` -> (file, line)."""
    found: dict[str, tuple[str, int]] = {}
    for name, source in modules.items():
        try:
            module = _module(name, source, parse_module(name, source))
        except PolicyError:
            continue
        for rule in module.rules:
            found.setdefault("data." + ".".join(rule.path), (name, rule.line))
    return found


# --- reading the AST ----------------------------------------------------------------


def _module(name: str, source: str, ast: Mapping[str, Any]) -> _Module:
    root, parts, _ = _chain(ast["package"]["refr"])
    package = (str(root), *parts)
    imports = []
    for item in ast.get("imports", []):
        root, parts, _ = _chain(item["refr"])
        if root == "data":
            alias = _span_text(source, item["as"]) if item.get("as") else (parts[-1] if parts else "data")
            imports.append((tuple(parts), alias, item["span"]["line"]))
    rules = []
    for node in ast.get("rules", []):
        kind, body = next(iter(node.items()))
        head = body if kind == "Default" else next(iter(body["head"].values()))
        root, parts, _ = _chain(head["refr"])
        rule = _Rule((*package, root, *parts), name, body["span"]["line"])
        _Walker(rule, source).visit(node, False)
        rules.append(rule)
    return _Module(name, source, package, imports, rules, name.endswith("_test.rego"))


def _chain(node: Mapping[str, Any]) -> tuple[str | None, list[str], list[Any]]:
    """A reference's root variable, its static path after the root (up to the first
    computed part) and the expressions of its computed parts."""
    kind, body = next(iter(node.items()))
    if kind == "Var":
        return body["value"], [], []
    if kind not in ("RefDot", "RefBrack"):
        return None, [], [node]
    root, parts, dynamic = _chain(body["refr"])
    if kind == "RefDot" and not dynamic:
        return root, [*parts, body["field"][1]], dynamic
    index = body.get("index", {})
    if kind == "RefBrack" and not dynamic and ("String" in index or "RawString" in index):
        return root, [*parts, next(iter(index.values()))["value"]], dynamic
    return root, parts, [*dynamic, index] if kind == "RefBrack" else dynamic


def _span_text(source: str, span: Mapping[str, Any]) -> str:
    return source.encode()[span["start"] : span["end"]].decode("utf-8", "replace")


class _Walker:
    """Collects one rule's references and calls, and which calls run while a query
    iterates the catalog (``some x in data….catalog…``, ``some k; data….catalog…[k]``)."""

    def __init__(self, rule: _Rule, source: str) -> None:
        self.rule, self.source = rule, source

    def visit(self, node: Any, scanning: bool) -> None:
        if isinstance(node, list):
            for item in node:
                self.visit(item, scanning)
            return
        if not isinstance(node, dict):
            return
        if "stmts" in node:  # a query: what follows its first iteration of the catalog runs per model
            start = self._catalog_iteration(node)
            for index, statement in enumerate(node["stmts"]):
                self.visit(statement, scanning or (start is not None and index > start))
            return
        if len(node) != 1:
            for value in node.values():
                self.visit(value, scanning)
            return
        kind, body = next(iter(node.items()))
        if kind in ("Var", "RefDot", "RefBrack"):
            root, parts, dynamic = _chain(node)
            if root is not None:
                self.rule.refs.add((root, *parts))
            self.visit(dynamic, scanning)
        elif kind == "Call":
            root, parts, dynamic = _chain(body["fcn"])
            name = ".".join([root or "?", *parts])
            self.rule.calls.append(_Call(name, body["params"], body["span"]["line"], scanning, (root, *parts) if root else None))
            self.visit([dynamic, body["params"]], scanning)
        elif kind in ("ArrayCompr", "SetCompr", "ObjectCompr") and self._catalog_iteration(body["query"]) is not None:
            self.visit(body["query"], scanning)
            self.visit([value for key, value in body.items() if key != "query"], True)  # the term: once per solution
        elif kind == "Every" and any("catalog" in parts for _, parts in _data_refs(body["domain"])):
            self.visit(body["domain"], scanning)
            self.visit(body["query"], True)
        else:
            self.visit(body, scanning)

    def _catalog_iteration(self, query: Mapping[str, Any]) -> int | None:
        """The index of the query's first statement that iterates the catalog, if any."""
        declared: set[str] = set()
        for index, statement in enumerate(query["stmts"]):
            kind, literal = next(iter(statement["literal"].items()))
            if kind == "SomeIn" and any("catalog" in parts for _, parts in _data_refs(literal["collection"])):
                return index
            if kind == "SomeVars":
                declared |= {_span_text(self.source, span) for span in literal["vars"]}
            if declared and any("catalog" in parts and _indexed_by(ref, declared) for ref, parts in _data_refs(literal)):
                return index
        return None


def _data_refs(node: Any) -> Iterator[tuple[Mapping[str, Any], list[str]]]:
    """Every reference under ``node`` rooted at ``data``, with its static path."""
    if isinstance(node, list):
        for item in node:
            yield from _data_refs(item)
    elif isinstance(node, dict):
        if len(node) == 1 and next(iter(node)) in ("RefDot", "RefBrack"):
            root, parts, _ = _chain(node)
            if root == "data":
                yield node, parts
        for value in node.values():
            yield from _data_refs(value)


def _indexed_by(ref: Mapping[str, Any], names: set[str]) -> bool:
    _, _, dynamic = _chain(ref)
    return any("Var" in part and part["Var"]["value"] in names for part in dynamic)


# --- the rule graph -------------------------------------------------------------------


def _resolve(modules: list[_Module], rules: Collection[tuple[str, ...]]) -> None:
    """Turn each rule's references into the rule paths they name: `data.…` by full path,
    an import's name through the import, a bare name inside the rule's own package."""
    prefixes: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for path in rules:
        for end in range(1, len(path) + 1):
            prefixes.setdefault(path[:end], set()).add(path)

    def named(ref: tuple[str, ...], module: _Module) -> set[tuple[str, ...]]:
        imported = {alias: path for path, alias, _ in module.imports}
        if ref[0] != "data" and ref[0] not in imported:  # a bare name: a rule of its own package, or a local
            own = (*module.package, ref[0])
            return {own} if own in rules else set()
        path = ref[1:] if ref[0] == "data" else imported[ref[0]] + ref[1:]
        covering = {path[:end] for end in range(1, len(path) + 1) if path[:end] in rules}
        return covering | prefixes.get(path, set())  # a whole package read names all its rules

    for module in modules:
        for rule in module.rules:
            rule.refs = {target for ref in rule.refs if ref[0] not in _NOT_DATA for target in named(ref, module)}
            for call in rule.calls:
                call.targets = named(call.ref, module) if call.ref else set()


def _reachable(rules: Mapping[tuple[str, ...], list[_Rule]], roots: list[tuple[str, ...]]) -> set[tuple[str, ...]]:
    seen: set[tuple[str, ...]] = set()
    pending = [root for root in roots if root in rules]
    while pending:
        path = pending.pop()
        if path not in seen:
            seen.add(path)
            pending.extend(target for rule in rules[path] for target in rule.refs | rule.callees)
    return seen


def _matching_functions(rules: Mapping[tuple[str, ...], list[_Rule]]) -> set[tuple[str, ...]]:
    """Rules that match globs or regexes themselves or through the functions they call."""
    matching = {path for path, defined in rules.items() if any(call.name in _MATCHERS for rule in defined for call in rule.calls)}
    grew = True
    while grew:
        grown = {path for path, defined in rules.items() if any(rule.callees & matching for rule in defined)} - matching
        matching |= grown
        grew = bool(grown)
    return matching


# --- the rules ------------------------------------------------------------------------


def _package_imports(module: _Module, packages: set[tuple[str, ...]]) -> Iterator[LintFinding]:
    for path, alias, line in module.imports:
        if any(package[: len(path)] == path for package in packages):
            shown = ".".join(["data", *path])
            yield LintFinding(
                module.file,
                line,
                "whole-package-import",
                f"import {shown} imports a package: regorus evaluates the whole package document when a rule is read "
                f"through {alias!r} (milliseconds, against microseconds); refer to the rule by full path ({shown}.<rule>)",
            )


def _catalog_scans(module: _Module, request_path: set[tuple[str, ...]], matching: set[tuple[str, ...]]) -> Iterator[LintFinding]:
    for rule in module.rules:
        if rule.path not in request_path:
            continue
        for call in rule.calls:
            if call.scanning_catalog and (call.name in _MATCHERS or call.targets & matching):
                how = call.name if call.name in _MATCHERS else f"{call.name} (which matches globs or regexes)"
                yield LintFinding(
                    module.file,
                    call.line,
                    "catalog-glob-scan",
                    f"{how} for every catalog model, in a rule on the request path: each request pays one match per model "
                    "and pattern; precompute it in the per-bundle index (compiled_index, read at data.portcullis.compiled)",
                )


def _nondeterministic(module: _Module) -> Iterator[LintFinding]:
    called = [(call.line, call.name) for rule in module.rules for call in rule.calls]
    for number, text in enumerate(module.source.splitlines(), start=1):
        for found in NON_DETERMINISTIC.finditer(text):
            builtin = found[1]
            name = next((name for line, name in called if line == number and name.startswith(builtin)), None)
            if name:
                why = f"{name} changes between two evaluations of the same input"
                fix = "pass the value in the input document instead"
            else:
                shown = builtin + "*" if builtin.endswith(".") else builtin
                why = f"{shown} is named outside a call (a comment or string), and the gateway reads the modules' text for it"
                fix = "reword the mention"
            yield LintFinding(
                module.file, number, "nondeterministic-builtin", f"{why}: the bundle gets no decision cache, every request is evaluated afresh; {fix}"
            )


def _portability(module: _Module) -> Iterator[LintFinding]:
    for rule in module.rules:
        for call in rule.calls:
            literal = _literal(call.params, 0) if call.name == "glob.match" else None
            problem = glob_problem(literal) if literal is not None else None
            if problem:
                yield LintFinding(module.file, call.line, "glob-wildcard-non-ascii", f"{problem} (regorus matches ? and [...] by byte, OPA by character)")
            pattern = _literal(call.params, _REGEX_PATTERN_ARG[call.name]) if call.name in _REGEX_PATTERN_ARG else None
            problem = _regex_problem(pattern) if pattern is not None else None
            if problem:
                yield LintFinding(module.file, call.line, "regex-class-differs", problem)


def _literal(params: list[Any], index: int) -> str | None:
    if index >= len(params):
        return None
    kind, body = next(iter(params[index].items()))
    return body["value"] if kind in ("String", "RawString") else None


def _regex_problem(pattern: str) -> str | None:
    escapes = sorted({pattern[i : i + 2] for i in _escape_offsets(pattern) if pattern[i + 1 : i + 2] in _UNICODE_ESCAPES})
    if escapes:
        return (
            f"pattern `{pattern}` uses {' '.join(escapes)}, ASCII in OPA (RE2) and Unicode in regorus; "
            "spell the class out in ASCII ([0-9], [A-Za-z0-9_], [ \\t\\n\\r\\f\\v], (?:^|[^0-9A-Za-z_]) for \\b)"
        )
    # with every escape made a plain letter, what portable.py finds is the class structure
    neutral = list(pattern)
    for i in _escape_offsets(pattern):
        neutral[i : i + 2] = ["x", "x"]
    problem = pattern_problem("".join(neutral))
    return f"pattern `{pattern}`: {problem.removeprefix('its pattern ')}" if problem else None


def _escape_offsets(pattern: str) -> Iterator[int]:
    index = 0
    while index < len(pattern) - 1:
        if pattern[index] == "\\":
            yield index
            index += 2
        else:
            index += 1


def _entry_point_metadata(module: _Module) -> Iterator[LintFinding]:
    lines = module.source.splitlines()
    first: dict[tuple[str, ...], int] = {}
    for rule in module.rules:
        first[rule.path] = min(first.get(rule.path, rule.line), rule.line)
    for entry in ENTRY_POINTS:
        line = first.get(tuple(entry.split(".")[1:]))
        if line is None:
            continue
        block: list[str] = []
        above = line - 2
        while above >= 0 and lines[above].lstrip().startswith("#"):
            block.insert(0, lines[above].strip())
            above -= 1
        start = next((i for i, text in enumerate(block) if text.removeprefix("#").strip() == "METADATA"), None)
        if start is None:
            message = f"entry point {entry} has no # METADATA block right above it (title, description, entrypoint: true)"
        elif not any(re.fullmatch(r"#\s*entrypoint:\s*true", text) for text in block[start:]):
            message = f"entry point {entry}'s # METADATA block does not say entrypoint: true"
        else:
            continue
        yield LintFinding(module.file, line, "entry-point-metadata", f"{message}: OPA tooling and reviewers find the gateway's entry points by it")


def _suppressed(finding: LintFinding, source: str) -> bool:
    lines = source.splitlines()
    for number in (finding.line, finding.line - 1):
        if 1 <= number <= len(lines):
            for found in _SUPPRESSION.finditer(lines[number - 1]):
                if finding.rule in re.split(r"\s*,\s*", found[1]):
                    return True
    return False
