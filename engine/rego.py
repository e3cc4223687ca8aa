"""The one module that talks to regorus, the embedded Rego evaluator.

Traps this module absorbs so no caller has to know them:
- a regorus ``Engine`` may only be used, and dropped, on the thread that built it, so
  every thread gets its own engine, built lazily from the same immutable sources, and
  a policy released on another thread (the garbage collector runs on whichever
  thread allocates) leaves each foreign engine to be dropped by its own thread;
- with ``RUST_BACKTRACE=1`` each Rego error captures a backtrace (~0.7 ms), so
  library backtraces are switched off unless the operator asked for them;
- Rego errors surface as ``RuntimeError``; they become ``PolicyError`` here;
- regorus's coverage report leaves out every module no evaluation reached, so the
  lines such a module could cover are found by evaluating a probe rule appended to it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("RUST_LIB_BACKTRACE", "0")  # read by regorus when it captures an error

import regorus  # imported after the environment above is set

# Builtins whose value changes between two evaluations of the same input (a trailing
# dot: the whole family). Read in the modules' text, so a mention counts too.
NON_DETERMINISTIC_BUILTINS = ("time.now_ns", "rand.", "uuid.rfc4122", "http.send", "opa.runtime", "net.lookup_ip_addr")
NON_DETERMINISTIC = re.compile(r"\b(" + "|".join(map(re.escape, NON_DETERMINISTIC_BUILTINS)) + ")")
_PROBE = "portcullis_coverage_probe_"  # a rule name no policy defines: see _coverable_lines
_LOCATION = re.compile(r"-->\s*(?P<file>\S.*?):(?P<line>\d+):(?P<col>\d+)")


class PolicyError(Exception):
    """A Rego module failed to parse or a query failed to evaluate."""


@dataclass(frozen=True)
class Statement:
    """One statement of a rule body, as written: enough to re-evaluate it, or its
    operands, in the rule's own package when a test fails."""

    text: str
    line: int
    operands: tuple[str, ...]  # the sides of a comparison or membership, the operand of `not`, else the expression
    modifiers: str  # the statement's `with …` clauses, applied to its operands too


@dataclass(frozen=True)
class TestRule:
    """A ``test_*`` rule of a Rego module: its query path, where it is defined and,
    for explaining a failure, its bodies and the module's imports."""

    path: str
    file: str
    line: int = 0
    package: str = ""
    imports: tuple[str, ...] = ()
    bodies: tuple[tuple[Statement, ...], ...] = ()


# Engines whose policy was released on another thread, by the thread that built them:
# each is dropped there the next time that thread evaluates anything.
_orphans: dict[int, list[Any]] = {}
_orphans_lock = threading.Lock()


class _Engines(dict[int, Any]):
    """One policy's engines, by the ident of the thread that built each."""

    def __del__(self) -> None:
        here = threading.get_ident()
        foreign = [(ident, engine) for ident, engine in self.items() if ident != here]
        if foreign:
            with _orphans_lock:
                for ident, engine in foreign:
                    _orphans.setdefault(ident, []).append(engine)
        self.clear()  # this thread's own engine, if any, is dropped here, where it was built


def _drop_orphans() -> None:
    with _orphans_lock:
        orphans = _orphans.pop(threading.get_ident(), None)
    del orphans  # outside the lock: dropping an engine frees its whole document


class Policy:
    """Rego modules plus a data document, evaluated on per-thread engines."""

    def __init__(self, modules: Mapping[str, str], data: Mapping[str, Any], *, coverage: bool = False) -> None:
        self._modules = dict(modules)
        self._data = data
        self._coverage = coverage  # record the lines evaluations reach (policy test --coverage); slower
        self._engines = _Engines()
        self._engine()  # parse now, so a broken module fails at load, not at first use

    @property
    def deterministic(self) -> bool:
        """True when no module calls a builtin that reads the clock, randomness or the
        network, so equal inputs always evaluate to equal values."""
        return not any(NON_DETERMINISTIC.search(source) for source in self._modules.values())

    def evaluate(self, rule: str, input_document: Mapping[str, Any]) -> Any:
        """The value of ``rule`` (e.g. ``data.portcullis.decision``); ``None`` if undefined."""
        return self.evaluate_json(rule, json.dumps(input_document))

    def evaluate_json(self, rule: str, input_json: str) -> Any:
        """Like ``evaluate`` with the input already as JSON. Input always crosses into
        regorus as JSON text: it rejects what it cannot represent (a lone surrogate),
        where handing over Python strings crashes the process."""
        engine = self._engine()
        try:
            engine.set_input_json(input_json)
            return engine.eval_rule(rule)
        except RuntimeError as error:
            raise PolicyError(str(error).strip()) from None

    def query(self, expression: str, input_document: Mapping[str, Any]) -> Any:
        """The value of one Rego expression (``data.portcullis.access.entitlements(input.principal)``:
        a function call, which ``evaluate`` cannot name) for ``input_document``; ``None``
        if undefined. For explaining a decision off the request path (``policy eval``)."""
        engine = self._engine()
        try:
            engine.set_input_json(json.dumps(input_document))
            results = engine.eval_query(expression)["result"]
        except RuntimeError as error:
            raise PolicyError(str(error).strip()) from None
        return results[0]["expressions"][0]["value"] if results else None

    def test_rules(self) -> list[TestRule]:
        """Every rule named ``test_*``, OPA's convention for policy unit tests."""
        found: dict[str, TestRule] = {}
        for module in json.loads(self._engine().get_ast_as_json()):
            package = _ref_path(module["ast"]["package"]["refr"])
            file = module["source"]["file"]
            source = self._modules.get(file, "").encode()
            imports = tuple(_text(source, item["span"]) for item in module["ast"].get("imports", []))
            for rule in module["ast"].get("rules", []):
                name = _rule_name(rule)
                if name and name.startswith("test_"):
                    path = f"data.{package}.{name}"
                    spec = rule["Spec"]
                    bodies = tuple(tuple(_statement(source, st) for st in body["query"]["stmts"]) for body in spec.get("bodies", []))
                    found.setdefault(path, TestRule(path, file, spec["span"]["line"], package, imports, bodies))
        return list(found.values())

    def rule_paths(self) -> set[tuple[str, ...]]:
        """The data path every rule of the modules defines (its package, then the
        static part of its head), to tell rules from data documents."""
        paths = set()
        for module in json.loads(self._engine().get_ast_as_json()):
            package = tuple(_ref_parts(module["ast"]["package"]["refr"]))
            for rule in module["ast"].get("rules", []):
                kind, node = next(iter(rule.items()))
                ref = node.get("refr") if kind == "Default" else next(iter(node.get("head", {}).values()), {}).get("refr")
                if ref:
                    paths.add(package + tuple(_static_parts(ref)))
        return paths

    def run_test(self, rule: TestRule) -> tuple[bool, list[str], bool]:
        """Evaluate one test rule: it passes only when it is defined and true. Returns
        (passed, its prints followed by any error, whether evaluation raised an error)."""
        engine = self._engine()
        engine.set_gather_prints(True)
        try:
            engine.set_input({})
            value = engine.eval_rule(rule.path)
            passed = value is True
            detail: list[str] = []
        except RuntimeError as error:
            passed, detail = False, [str(error).strip()]
        finally:
            prints = list(engine.take_prints())
            engine.set_gather_prints(False)
        return passed, prints + detail, bool(detail)

    def bench_test(self, rule: TestRule, min_ns: int) -> tuple[int, int]:
        """Evaluate one test rule again and again for at least ``min_ns``: (iterations,
        nanoseconds they took). Prints are gathered and dropped, never written to stdout."""
        engine = self._engine()
        engine.set_gather_prints(True)
        iterations = 0
        try:
            engine.set_input({})
            started = time.perf_counter_ns()
            elapsed = 0
            while elapsed < min_ns or iterations == 0:
                with contextlib.suppress(RuntimeError):  # an erroring test is timed too: run_test reports the error
                    engine.eval_rule(rule.path)
                engine.take_prints()  # else they pile up for the whole run
                iterations += 1
                elapsed = time.perf_counter_ns() - started
        finally:
            engine.set_gather_prints(False)
        return iterations, elapsed

    def coverage(self, names: Collection[str] | None = None) -> dict[str, tuple[frozenset[int], frozenset[int]]]:
        """Per module (of ``names``, else all), (lines covered, lines not covered) by this
        thread's evaluations so far; a module no evaluation reached has every line it
        could cover not covered. Lines are regorus's: those of expressions in rule
        bodies and in heads' values (a head without one, ``allow if``, has none)."""
        if not self._coverage:
            raise ValueError("coverage was not enabled for this policy")
        try:
            report = json.loads(self._engine().get_coverage_report_as_json())
        except RuntimeError as error:
            raise PolicyError(str(error).strip()) from None
        wanted = self._modules.keys() if names is None else set(names) & self._modules.keys()
        found = {file["path"]: (frozenset(file["covered"]), frozenset(file["not_covered"])) for file in report["files"] if file["path"] in wanted}
        unreached = [name for name in self._modules if name in wanted and name not in found]
        for name, lines in _coverable_lines(self._modules, unreached, self._data).items():
            found[name] = (frozenset(), lines)
        return found

    def release_thread(self) -> None:
        """Drop this thread's engine now, on the thread that built it. Call it before a
        thread that will not evaluate this policy again hands it on (a loader thread)."""
        self._engines.pop(threading.get_ident(), None)

    def _engine(self) -> Any:
        if _orphans:  # a lock-free look first: almost always empty
            _drop_orphans()
        ident = threading.get_ident()
        engine = self._engines.get(ident)
        if engine is None:
            engine = regorus.Engine()
            if self._coverage:
                engine.set_enable_coverage(True)
            try:
                for name, source in self._modules.items():
                    engine.add_policy(name, source)
                engine.add_data(self._data)
            except RuntimeError as error:
                raise PolicyError(str(error).strip()) from None
            self._engines[ident] = engine
        return engine


def _coverable_lines(modules: Mapping[str, str], names: list[str], data: Mapping[str, Any]) -> dict[str, frozenset[int]]:
    """The lines each of ``names`` could cover. A probe rule appended to each (below
    its last line, so no line moves) is evaluated on a throwaway engine: that puts the
    module in regorus's report, whose covered and not covered lines are then all of them."""
    if not names:
        return {}
    probes = {name: (f"{_PROBE}{index}", modules[name].count("\n") + 2) for index, name in enumerate(names)}
    engine = regorus.Engine()
    engine.set_enable_coverage(True)
    try:
        for name, source in modules.items():
            engine.add_policy(name, source + (f"\n{probes[name][0]} := true\n" if name in probes else ""))
        engine.add_data(data)
        engine.set_input({})
        packages = {name: package for name, package in _packages(engine).items() if name in probes}
        for name, (rule, _) in probes.items():
            engine.eval_rule(f"data.{packages[name]}.{rule}")
        report = json.loads(engine.get_coverage_report_as_json())
    except RuntimeError as error:
        raise PolicyError(str(error).strip()) from None
    lines = {file["path"]: {*file["covered"], *file["not_covered"]} for file in report["files"] if file["path"] in probes}
    return {name: frozenset(lines.get(name, set()) - {line}) for name, (_, line) in probes.items()}


def _packages(engine: Any) -> dict[str, str]:
    return {module["source"]["file"]: _ref_path(module["ast"]["package"]["refr"]) for module in json.loads(engine.get_ast_as_json())}


def parse_module(name: str, source: str) -> dict[str, Any]:
    """The parsed AST of one module, in regorus's JSON form (``package``, ``imports``,
    ``rules``; every node carries a ``span`` with its line, column and byte offsets).
    A throwaway engine, built and dropped on this thread, so one broken module never
    hides another's errors. ``PolicyError`` when it does not parse."""
    engine = regorus.Engine()
    try:
        engine.add_policy(name, source)
        return json.loads(engine.get_ast_as_json())[0]["ast"]
    except RuntimeError as error:
        raise PolicyError(str(error).strip()) from None


def error_location(message: str) -> tuple[str, int, int] | None:
    """(file, line, column) a regorus error points at (its ``--> file:line:col``), or None."""
    found = _LOCATION.search(message)
    return (found["file"], int(found["line"]), int(found["col"])) if found else None


def error_summary(message: str) -> str:
    """A regorus error's own words (its ``error: …`` line) without the source excerpt."""
    lines = [line.strip() for line in message.splitlines()]
    return next((line.removeprefix("error:").strip() for line in lines if line.startswith("error:")), " ".join(filter(None, lines)))


def _ref_path(ref: Mapping[str, Any]) -> str:
    return ".".join(_ref_parts(ref))


def _ref_parts(ref: Mapping[str, Any]) -> Iterator[str]:
    if "Var" in ref:
        yield ref["Var"]["value"]
    elif "RefDot" in ref:
        yield from _ref_parts(ref["RefDot"]["refr"])
        yield ref["RefDot"]["field"][1]


def _static_parts(ref: Mapping[str, Any]) -> Iterator[str]:
    """A rule head's path up to its first bracket (`a.b[x]` defines data.….a.b)."""
    if "RefBrack" in ref:
        yield from _static_parts(ref["RefBrack"]["refr"])
    else:
        yield from _ref_parts(ref)


def _rule_name(rule: Mapping[str, Any]) -> str | None:
    spec = rule.get("Spec")
    if not spec:
        return None
    head = next(iter(spec["head"].values()))
    ref = head.get("refr")
    if not ref:
        return None
    parts = list(_ref_parts(ref))
    return parts[0] if parts else None


def _text(source: bytes, span: Mapping[str, Any]) -> str:
    """The source a span covers. regorus spans are byte offsets, and a string literal's
    span leaves out its quotes: take them back when they sit right at an edge."""
    start, end = span["start"], span["end"]
    if start > 0 and source[start - 1 : start] in (b'"', b"`"):
        start -= 1
    if source[end : end + 1] in (b'"', b"`"):
        end += 1
    return source[start:end].decode("utf-8", "replace").strip()


def _statement(source: bytes, statement: Mapping[str, Any]) -> Statement:
    literal = statement["literal"]
    kind, node = next(iter(literal.items()))
    operands: tuple[str, ...] = ()
    modifiers = ""
    if kind == "NotExpr":
        operands = (_text(source, next(iter(node["expr"].values()))["span"]),)
    elif kind == "Expr":
        expression_kind, expression = next(iter(node["expr"].items()))
        if expression_kind == "BoolExpr":
            operands = (_text(source, _span_of(expression["lhs"])), _text(source, _span_of(expression["rhs"])))
        elif expression_kind == "Membership":
            operands = (_text(source, _span_of(expression["value"])), _text(source, _span_of(expression["collection"])))
        elif expression_kind not in ("AssignExpr",):
            operands = (_text(source, expression["span"]),)
        if statement.get("with_mods"):
            modifiers = source[node["span"]["end"] : statement["span"]["end"]].decode("utf-8", "replace").strip()
    return Statement(_text(source, statement["span"]), statement["span"]["line"], operands, modifiers)


def _span_of(node: Mapping[str, Any]) -> Mapping[str, Any]:
    return next(iter(node.values()))["span"]
