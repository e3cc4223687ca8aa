"""`portcullis policy lint`: one finding per rule on a small module, per-line
suppressions, and the shipped bundle linting clean (its one intended finding
suppressed, with the reason, in access.rego)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from portcullis.engine.policy_lint import RULES, LintFinding, lint_modules

ROOT = Path(__file__).resolve().parent.parent

# A served module beside each case, so data.portcullis.lib is a known package and the
# request path has its entry point.
LIB = "package portcullis.lib\n\ncovers(teams, team) if team in teams\n"
ENTRY = "package portcullis\n\n# METADATA\n# title: d\n# entrypoint: true\ndecision := data.portcullis.x.run(input)\n"

CASES = {
    "whole-package-import": ("package portcullis.x\n\nimport data.portcullis.lib\n\nrun(i) := lib.covers(i.teams, i.team)\n", 3),
    "catalog-glob-scan": (
        "package portcullis.x\n\nrun(i) := {m | some m, _ in data.portcullis.catalog.models\n\tglob.match(i.pattern, null, m)\n}\n",
        4,
    ),
    "nondeterministic-builtin": ("package portcullis.x\n\nrun(i) := i if {\n\ttime.now_ns() > 0\n}\n", 4),
    "glob-wildcard-non-ascii": ('package portcullis.x\n\nrun(i) if glob.match("claude-?", null, i.model)\n', 3),
    "regex-class-differs": ("package portcullis.x\n\nrun(i) if regex.match(`\\bsecret\\s`, i.text)\n", 3),
    "entry-point-metadata": ("package portcullis\n\n# the tool-call verdicts\ntool_call_verdicts := []\n\nrun(i) := i\n", 4),
}


def lint(**modules: str) -> list[LintFinding]:
    return lint_modules({f"{name}.rego": source for name, source in modules.items()})


@pytest.mark.parametrize("rule", sorted(CASES))
def test_each_rule_finds_its_trap_once_at_its_line(rule: str) -> None:
    source, line = CASES[rule]
    entry = {} if rule == "entry-point-metadata" else {"entry": ENTRY}
    findings = lint(lib=LIB, case=source, **entry)
    assert [(f.file, f.line, f.rule) for f in findings] == [("case.rego", line, rule)], findings
    assert str(findings[0]).startswith(f"case.rego:{line}: {rule}: ")


def test_every_rule_is_exercised() -> None:
    assert set(CASES) | {"syntax-error"} == set(RULES)


@pytest.mark.parametrize("placement", ["same line", "line above"])
def test_a_suppression_silences_its_rule_only(placement: str) -> None:
    call = 'run(i) if glob.match("claude-?", null, i.model)'
    comment = "# portcullis-lint: ignore regex-class-differs, glob-wildcard-non-ascii -- the pattern is ASCII by construction"
    body = f"{call} {comment}\n" if placement == "same line" else f"{comment}\n{call}\n"
    assert lint(lib=LIB, entry=ENTRY, case=f"package portcullis.x\n\n{body}") == []
    other = body.replace("regex-class-differs, glob-wildcard-non-ascii", "regex-class-differs")
    assert [f.rule for f in lint(lib=LIB, entry=ENTRY, case=f"package portcullis.x\n\n{other}")] == ["glob-wildcard-non-ascii"]


def test_a_suppression_two_lines_up_does_not_count() -> None:
    source = 'package portcullis.x\n\n# portcullis-lint: ignore glob-wildcard-non-ascii\n\nrun(i) if glob.match("a?", null, i.model)\n'
    assert [f.rule for f in lint(lib=LIB, entry=ENTRY, case=source)] == ["glob-wildcard-non-ascii"]


def test_what_is_not_a_trap_is_not_reported() -> None:
    quiet = (
        "package portcullis.x\n\n"
        "import data.portcullis.lib.covers\n\n"  # a rule, not a package
        "# the index is built once per bundle: glob matching there costs nothing per request\n"
        'index := {m: true | some m, _ in data.portcullis.catalog.models; glob.match("*", null, m)}\n\n'
        "run(i) := {m | m := data.portcullis.catalog.models[i.model]; regex.match(`^[0-9A-Za-z_]+$`, m.name)} if covers(i.teams, i.team)\n"
    )
    index = "package portcullis\n\n# METADATA\n# title: i\n# entrypoint: true\ncompiled_index := data.portcullis.x.index\n"
    assert lint(lib=LIB, entry=ENTRY, index=index, case=quiet) == []


def test_a_glob_reached_through_a_function_is_found_where_the_catalog_is_iterated() -> None:
    source = (
        "package portcullis.x\n\n"
        "run(i) := [m | some m, _ in data.portcullis.catalog.models; _granted(i.patterns, m)]\n\n"
        "_granted(patterns, m) if {\n\tsome p in patterns\n\tglob.match(p, null, m)\n}\n"
    )
    findings = lint(lib=LIB, entry=ENTRY, case=source)
    assert [(f.line, f.rule) for f in findings] == [(3, "catalog-glob-scan")] and "_granted" in findings[0].message


def test_naming_a_nondeterministic_builtin_in_a_comment_counts_too() -> None:
    # Policy.deterministic reads the text: this comment alone turns the decision cache off
    findings = lint(lib=LIB, entry=ENTRY, case="package portcullis.x\n\n# never call http.send here\nrun(i) := i\n")
    assert [(f.line, f.rule) for f in findings] == [(3, "nondeterministic-builtin")] and "comment" in findings[0].message


def test_an_entry_point_metadata_block_must_say_entrypoint_true() -> None:
    source = "package portcullis\n\n# METADATA\n# title: Decision\ndecision := 1\n"
    findings = lint(case=source)
    assert [(f.line, f.rule) for f in findings] == [(5, "entry-point-metadata")] and "entrypoint: true" in findings[0].message


def test_a_module_that_does_not_parse_is_a_finding_and_others_are_still_linted() -> None:
    findings = lint(lib=LIB, entry=ENTRY, broken="package portcullis.y\n\nx if {\n", case=CASES["glob-wildcard-non-ascii"][0])
    assert [(f.file, f.rule) for f in findings] == [("broken.rego", "syntax-error"), ("case.rego", "glob-wildcard-non-ascii")]
    assert findings[0].line == 4


def shipped_modules() -> dict[str, str]:
    return {str(path.relative_to(ROOT)): path.read_text() for folder in ("policies", "policy-tests") for path in sorted((ROOT / folder).rglob("*.rego"))}


def test_the_shipped_policies_lint_clean_with_one_justified_suppression() -> None:
    modules = shipped_modules()
    assert lint_modules(modules) == []
    suppressions = [(name, source.count("portcullis-lint: ignore")) for name, source in modules.items() if "portcullis-lint: ignore" in source]
    assert suppressions == [("policies/portcullis/access.rego", 1)]
    # without it, the finding it silences is back: a fallback for policy tests that mock data
    access = "policies/portcullis/access.rego"
    unsuppressed = {**modules, access: "\n".join(line if "portcullis-lint" not in line else "" for line in modules[access].splitlines())}
    found = lint_modules(unsuppressed)
    glob_line = next(n for n, text in enumerate(modules[access].splitlines(), 1) if "glob.match(pattern, null, model)" in text)
    assert [(f.file, f.line, f.rule) for f in found] == [(access, glob_line, "catalog-glob-scan")]


def policy_lint(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "portcullis.adapters.cli", "policy", "lint", *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def test_the_command_lints_the_shipped_bundle_clean() -> None:
    result = policy_lint("policies", "policy-tests")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok: 0 findings in ")


def test_the_command_reports_file_line_rule_and_fails(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "case.rego").write_text(CASES["regex-class-differs"][0])
    (tmp_path / "lone.rego").write_text(CASES["glob-wildcard-non-ascii"][0])
    result = policy_lint("b", "lone.rego", cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("b/case.rego:3: regex-class-differs: pattern `\\bsecret\\s` uses \\b \\s")
    assert lines[1].startswith("lone.rego:3: glob-wildcard-non-ascii: ")
    assert lines[2] == "FAIL: 2 findings in 2 modules"
    document = json.loads(policy_lint("b", "--format", "json", cwd=tmp_path).stdout)
    assert document["ok"] is False and [(f["file"], f["line"], f["rule"]) for f in document["findings"]] == [("b/case.rego", 3, "regex-class-differs")]
