"""`portcullis policy init DIR`: the bundle repository it writes passes its own pipeline
(policy test at the workflow's coverage threshold, check, lint), and its CI script runs
end to end: unchanged it exits 0 with a signed .tar.gz; a data change that grants a team
a model it was refused fails at the diff step, before anything is signed, unless the
widening is approved (ALLOW_WIDENING). A diff or signature that cannot run is skipped
loudly, and fails the run when required (REQUIRE_DIFF, REQUIRE_SIGNATURE); a live
revision that does not resolve is an error. `--force` names what it replaces and never
writes through a link or over bundle data."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from portcullis.adapters.cli.policy_init import COVERAGE_THRESHOLD

ROOT = Path(__file__).resolve().parent.parent
PORTCULLIS = Path(sys.executable).parent / "portcullis"
DATA_FILES = ("tenants", "catalog", "governance", "pii", "integrity")
# Recorded requests: allowed, refused a model (support may not use sonnet), refused a team.
RECORDED = [
    ("platform", "alice", "sonnet"),
    ("platform", "intern", "gpt-4o-mini"),
    ("support", "sam", "haiku"),
    ("support", "sam", "claude-sonnet-4-5"),
    ("marketing", "mo", "haiku"),
]


def portcullis(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "PORTCULLIS_CONFIG"}  # no configuration unless given
    return subprocess.run([sys.executable, "-m", "portcullis.adapters.cli", *args], capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def policy_ci(repo: Path, **settings: str) -> subprocess.CompletedProcess:
    """ci/policy-ci.sh as CI runs it, with the settings as its environment."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PORTCULLIS", "LIVE_", "DECISION_LOG", "SIGNING_", "REQUIRE_"))}
    env |= {"PORTCULLIS": str(PORTCULLIS), **settings}
    return subprocess.run([str(repo / "ci" / "policy-ci.sh")], capture_output=True, text=True, timeout=300, cwd=repo.parent, env=env)


@pytest.fixture(scope="module")
def initialised(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    repo = tmp_path_factory.mktemp("init") / "repo"
    return repo, portcullis("policy", "init", str(repo), cwd=repo.parent)


@pytest.fixture
def repo(initialised: tuple[Path, subprocess.CompletedProcess], tmp_path: Path) -> Path:
    """A copy of the initialised repository, for a test to change."""
    return Path(shutil.copytree(initialised[0], tmp_path / "repo", symlinks=True))


def decision_log(path: Path) -> Path:
    """OPA decision-log events, one JSON object a line, as the gateway's file sink writes them."""
    events = [
        {
            "decision_id": f"starter-{number}",
            "path": "portcullis/decision",
            "input": {
                "principal": {"team": team, "user": user, "key_id": "key_00000000000000a1"},
                "request": {"protocol": "anthropic_messages", "model": model, "stream": False, "max_tokens": 100, "requires": [], "tools": []},
            },
            "result": {},
            "bundles": {"portcullis": {"revision": "starter-1"}},
            "timestamp": "2026-12-01T00:00:00.000000000Z",
        }
        for number, (team, user, model) in enumerate(RECORDED)
    ]
    path.write_text("".join(json.dumps(event) + "\n" for event in events))
    return path


def signing_key(directory: Path) -> tuple[Path, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = directory / "release.pem", directory / "release.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def grant_support_sonnet(repo: Path) -> None:
    """The change under review: support may now use claude-sonnet-4-5, and the tests that
    pinned the refusal are updated with it (so only the diff stands in its way)."""
    tenants = repo / "policies/portcullis/tenants/data.yaml"
    text = tenants.read_text()
    assert text.count("    models: [claude-haiku-4-5]\n") == 1
    tenants.write_text(text.replace("    models: [claude-haiku-4-5]\n", "    models: [claude-haiku-4-5, claude-sonnet-4-5]\n"))
    tests = repo / "policy-tests/access_test.rego"
    text = tests.read_text()
    text = text.replace('decide("support", "sam", "claude-sonnet-4-5")', 'decide("support", "sam", "gpt-4o-mini")')
    tests.write_text(text.replace('models == ["claude-haiku-4-5"]', 'models == ["claude-haiku-4-5", "claude-sonnet-4-5"]'))


def test_init_writes_the_bundle_its_tests_and_ci_and_says_what_next(initialised: tuple[Path, subprocess.CompletedProcess]) -> None:
    repo, result = initialised
    assert result.returncode == 0, result.stderr
    manifest = json.loads((repo / "policies/.manifest").read_text())
    assert (manifest["revision"], manifest["roots"], manifest["rego_version"]) == ("starter-1", ["portcullis"], 1)
    default_rego = {path.name: path.read_bytes() for path in (ROOT / "policies/portcullis").glob("*.rego")}
    assert {path.name: path.read_bytes() for path in (repo / "policies/portcullis").glob("*.rego")} == default_rego
    for concern in DATA_FILES:
        text = (repo / "policies/portcullis" / concern / "data.yaml").read_text()
        assert text.startswith("#") and "docs/" in text, concern  # commented, pointing at the docs
        assert yaml.safe_load(text), concern
    assert yaml.safe_load((repo / "policies/portcullis/tenants/data.yaml").read_text())["teams"].keys() == {"platform", "support"}
    assert sorted(path.name for path in (repo / "policy-tests").iterdir()) == [
        "access_test.rego",
        "integrity_test.rego",
        "limits_test.rego",
        "pii_test.rego",
        "routing_test.rego",
    ]
    assert os.access(repo / "ci/policy-ci.sh", os.X_OK)
    workflow = yaml.safe_load((repo / ".github/workflows/policy.yml").read_text())
    assert workflow["jobs"]["policy"]["steps"][-2]["run"] == "ci/policy-ci.sh"
    assert "build/" in (repo / ".gitignore").read_text().splitlines()
    assert "ci/policy-ci.sh" in (repo / "README.md").read_text()
    assert f"wrote {len([p for p in repo.rglob('*') if p.is_file()])} files into {repo}:" in result.stdout
    assert f"portcullis policy test policies policy-tests --coverage --threshold {COVERAGE_THRESHOLD}" in result.stdout


def test_the_starter_passes_its_tests_at_the_workflows_threshold(initialised: tuple[Path, subprocess.CompletedProcess]) -> None:
    repo = initialised[0]
    script = (repo / "ci/policy-ci.sh").read_text()
    assert re.search(r"^COVERAGE_THRESHOLD=\$\{COVERAGE_THRESHOLD:-(\d+)\}$", script, re.MULTILINE).group(1) == str(COVERAGE_THRESHOLD)
    result = portcullis("policy", "test", "policies", "policy-tests", "--coverage", "--threshold", str(COVERAGE_THRESHOLD), "-v", cwd=repo)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout and "ERROR" not in result.stdout
    for test in (
        "access_test.test_platform_gets_sonnet_from_bedrock_first",  # allowed
        "access_test.test_a_team_the_bundle_does_not_list_is_refused",
        "access_test.test_support_is_refused_a_model_it_is_not_granted",
        "access_test.test_the_region_lock_keeps_support_in_the_eu",
        "limits_test.test_each_support_agent_has_a_rate_of_their_own",
        "pii_test.test_support_pseudonymizes_contacts_and_blocks_secrets",
    ):
        assert f"data.portcullis.{test}: PASS" in result.stdout


def test_the_starter_activates_against_the_configuration_it_ships(initialised: tuple[Path, subprocess.CompletedProcess]) -> None:
    repo = initialised[0]
    plain = portcullis("policy", "check", "policies", cwd=repo)
    assert plain.returncode == 0 and plain.stdout.startswith("ok: policies (revision 'starter-1')"), plain.stdout + plain.stderr
    checked = portcullis("policy", "check", "policies", "--config", "ci/gateway.yaml", cwd=repo)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert {"anthropic", "bedrock", "openai"} == {provider["name"] for provider in yaml.safe_load((repo / "ci/gateway.yaml").read_text())["providers"]}
    assert "  passed   providers:" in checked.stdout and "  passed   pii detectors:" in checked.stdout
    linted = portcullis("policy", "lint", ".", cwd=repo)  # the bundle, its tests and the rest of the repository
    assert linted.returncode == 0 and re.fullmatch(r"ok: 0 findings in \d+ modules", linted.stdout.strip()), linted.stdout + linted.stderr


def tree(root: Path) -> dict[str, str]:
    """Everything under root, links as links: what a refused init must leave as it was."""
    found = {}
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        found[name] = f"-> {os.readlink(path)}" if path.is_symlink() else ("<dir>" if path.is_dir() else path.read_text())
    return found


def test_a_non_empty_directory_is_refused_unless_forced(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    refused = portcullis("policy", "init", str(tmp_path), cwd=tmp_path)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert f"portcullis: {tmp_path} is not empty (notes.txt); choose a new or empty directory, or give --force" in refused.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]
    forced = portcullis("policy", "init", str(tmp_path), "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine\n" and (tmp_path / "policies/.manifest").is_file()
    assert re.match(r"wrote \d+ files into .*:\n", forced.stdout) and "replaced" not in forced.stdout
    not_a_directory = portcullis("policy", "init", str(tmp_path / "notes.txt"), cwd=tmp_path)
    assert not_a_directory.returncode == 1 and "notes.txt exists and is not a directory" in not_a_directory.stderr
    assert "Traceback" not in not_a_directory.stderr


def test_force_names_every_file_it_replaces(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("ours\n")
    (tmp_path / "ci").mkdir()
    (tmp_path / "ci/gateway.yaml").write_text("ours\n")
    (tmp_path / "policies/portcullis").mkdir(parents=True)
    (tmp_path / "policies/portcullis/access.rego").write_text("package portcullis.access\n")  # an older default module
    forced = portcullis("policy", "init", str(tmp_path), "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    written = re.match(r"wrote (\d+) files into ", forced.stdout).group(1)
    assert f"wrote {written} files into {tmp_path} (3 replaced):" in forced.stdout
    replaced = forced.stdout.split("replaced (--force; what they held before is gone): 3 files\n")[1].split("next:")[0]
    assert replaced.splitlines() == ["  README.md", "  ci/gateway.yaml", "  policies/portcullis/access.rego"]
    assert (tmp_path / "README.md").read_text() != "ours\n"
    assert (tmp_path / "policies/portcullis/access.rego").read_bytes() == (ROOT / "policies/portcullis/access.rego").read_bytes()


@pytest.mark.parametrize(
    "existing",
    [
        ["policies/.manifest"],
        ["policies/portcullis/tenants/data.yaml"],
        ["policies/portcullis/tenants/data.json", "policies/portcullis/teams/eu/data.yaml", "policies/.manifest"],
    ],
)
def test_force_never_replaces_bundle_data(tmp_path: Path, existing: list[str]) -> None:
    for name in existing:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text('{"ours": true}\n')
    before = tree(tmp_path)
    refused = portcullis("policy", "init", str(tmp_path), "--force", cwd=tmp_path)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stdout + refused.stderr
    assert (
        f"portcullis: {tmp_path} already holds bundle data ({', '.join(sorted(existing))}): init writes a new repository; it will not replace your data"
        in refused.stderr
    )
    assert tree(tmp_path) == before and refused.stdout == ""  # nothing written


def test_force_never_writes_through_a_link(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "README.md").write_text("not yours\n")
    cases = {
        "README.md": outside / "README.md",  # a file's link, out of DIR
        "ci": outside,  # a folder's link, out of DIR
        ".gitignore": outside / "missing",  # a dangling link: writing would create the file out there
        ".github": "elsewhere",  # a link inside DIR is not followed either
    }
    for name, points_to in cases.items():
        target = tmp_path / f"repo-{name.strip('.')}"
        target.mkdir()
        (target / "elsewhere").mkdir()
        (target / name).symlink_to(points_to)
        before, outside_before = tree(target), tree(outside)
        refused = portcullis("policy", "init", str(target), "--force", cwd=tmp_path)
        assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stdout + refused.stderr
        assert f"portcullis: {target} holds symbolic links where init would write: {name} -> {points_to}; init does not write through links" in refused.stderr
        assert tree(target) == before and tree(outside) == outside_before, name  # nothing written, here or there


def test_force_refuses_a_folder_where_a_file_goes(tmp_path: Path) -> None:
    (tmp_path / "README.md").mkdir()
    before = tree(tmp_path)
    refused = portcullis("policy", "init", str(tmp_path), "--force", cwd=tmp_path)
    assert refused.returncode == 1 and "README.md; init wrote nothing" in refused.stderr, refused.stderr
    assert tree(tmp_path) == before


def test_the_directory_itself_may_be_a_link(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real/notes.txt").write_text("mine\n")
    (tmp_path / "link").symlink_to("real")
    forced = portcullis("policy", "init", str(tmp_path / "link"), "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert (tmp_path / "real/policies/.manifest").is_file()


def test_the_ci_script_passes_unchanged_and_stops_a_widening_at_the_diff(repo: Path, tmp_path: Path) -> None:
    live = Path(shutil.copytree(repo / "policies", tmp_path / "live"))
    log = decision_log(tmp_path / "decisions.jsonl")
    private, public = signing_key(tmp_path)
    settings = {"LIVE_BUNDLE": str(live), "DECISION_LOG": str(log), "SIGNING_KEY": str(private), "REQUIRE_DIFF": "true", "REQUIRE_SIGNATURE": "true"}
    passed = policy_ci(repo, **settings)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    for step in ("test", "check", "lint", "diff", "sign", "build"):
        assert f"\n==> {step}" in passed.stdout
    assert "replayed 5 decisions: 0 changed" in passed.stdout and "SKIPPED" not in passed.stderr
    assert passed.stdout.rstrip().endswith("done: every step ran")
    signed = portcullis("policy", "check", str(repo / "build/bundle.tar.gz"), "--public-key", f"release={public}", cwd=tmp_path)
    assert signed.returncode == 0 and "  passed   signature:" in signed.stdout and "(key 'release')" in signed.stdout, signed.stdout + signed.stderr

    grant_support_sonnet(repo)
    caught = policy_ci(repo, **settings)
    assert caught.returncode == 1, caught.stdout + caught.stderr
    assert "\n==> diff" in caught.stdout and "\n==> sign" not in caught.stdout
    assert "support/sam" in caught.stdout and "model_not_allowed → allowed" in caught.stdout
    assert "FAIL (--fail-on widen)" in caught.stdout
    assert not (repo / "build/bundle.tar.gz").exists()  # the previous run's output went first
    approved = policy_ci(repo, **settings, ALLOW_WIDENING="true")  # reviewers approved the widening
    assert approved.returncode == 0, approved.stdout + approved.stderr
    assert "!!! ALLOW_WIDENING is true: widenings below are reported, not refused" in approved.stderr
    assert "model_not_allowed → allowed" in approved.stdout and (repo / "build/bundle/.signatures.json").is_file()


GIT = ["git", "-c", "user.name=Policy CI", "-c", "user.email=ci@example.com", "-c", "commit.gpgsign=false"]


def commit_all(repo: Path, *, first_empty: bool = False) -> None:
    """The repository under git, all in one commit (after an empty one, if first_empty)."""
    subprocess.run([*GIT, "init", "--quiet", str(repo)], check=True, capture_output=True)
    if first_empty:
        subprocess.run([*GIT, "-C", str(repo), "commit", "--quiet", "--allow-empty", "--message", "empty"], check=True, capture_output=True)
    subprocess.run([*GIT, "-C", str(repo), "add", "--all"], check=True, capture_output=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "--quiet", "--message", "starter"], check=True, capture_output=True)


def test_without_a_decision_log_the_diff_is_skipped_loudly(repo: Path) -> None:
    commit_all(repo)
    skipped = policy_ci(repo, LIVE_REF="HEAD")
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "!!! diff SKIPPED: no decision log (set DECISION_LOG)" in skipped.stderr
    assert "!!! sign SKIPPED: no SIGNING_KEY" in skipped.stderr
    assert "done, with steps skipped:" in skipped.stderr and (repo / "build/bundle.tar.gz").is_file()  # every other step ran
    assert (repo / "build/live/.manifest").read_bytes() == (repo / "policies/.manifest").read_bytes()  # the live revision, from git


def test_a_required_diff_or_signature_that_cannot_run_fails_the_run(repo: Path, tmp_path: Path) -> None:
    commit_all(repo)
    no_log = policy_ci(repo, LIVE_REF="HEAD", REQUIRE_DIFF="true")
    assert no_log.returncode == 1, no_log.stdout + no_log.stderr
    assert "!!! diff SKIPPED: no decision log (set DECISION_LOG)" in no_log.stderr
    assert no_log.stderr.rstrip().endswith("REQUIRE_DIFF is true: the diff step must run, failing")
    assert "\n==> sign" not in no_log.stdout and not (repo / "build/bundle.tar.gz").exists()
    no_live = policy_ci(repo, DECISION_LOG=str(decision_log(tmp_path / "decisions.jsonl")), REQUIRE_DIFF="true")
    assert no_live.returncode == 1 and "!!! diff SKIPPED: no live revision" in no_live.stderr, no_live.stdout + no_live.stderr
    unsigned = policy_ci(repo, LIVE_REF="HEAD", REQUIRE_SIGNATURE="true")  # a pull request's run: the diff may skip
    assert unsigned.returncode == 1, unsigned.stdout + unsigned.stderr
    assert "!!! sign SKIPPED: no SIGNING_KEY" in unsigned.stderr
    assert unsigned.stderr.rstrip().endswith("REQUIRE_SIGNATURE is true: the sign step must run, failing")
    assert "\n==> build" not in unsigned.stdout and not (repo / "build/bundle.tar.gz").exists()  # no unsigned bundle to ship
    old_setting = policy_ci(repo, LIVE_REF="HEAD", REQUIRE_ALL_STEPS="true")
    assert old_setting.returncode == 1 and "REQUIRE_ALL_STEPS is gone: set REQUIRE_DIFF and REQUIRE_SIGNATURE instead" in old_setting.stderr


@pytest.mark.parametrize("live_ref", ["origin/main", "mian", "0123456789abcdef0123456789abcdef01234567"])
def test_a_live_ref_that_does_not_resolve_is_an_error_not_a_skip(repo: Path, live_ref: str) -> None:
    commit_all(repo)
    failed = policy_ci(repo, LIVE_REF=live_ref)  # not fetched, mistyped, unreachable: not "nothing to compare with"
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert f"!!! LIVE_REF {live_ref} does not resolve to a commit here (mistyped, or not fetched" in failed.stderr
    assert "SKIPPED" not in failed.stderr and "\n==> sign" not in failed.stdout


def test_a_live_ref_outside_git_is_an_error(repo: Path) -> None:
    failed = policy_ci(repo, LIVE_REF="HEAD", GIT_CEILING_DIRECTORIES=str(repo.parent))  # no repository above repo either
    assert failed.returncode == 1 and "is not in a git repository: set LIVE_BUNDLE instead, or unset LIVE_REF" in failed.stderr, failed.stderr


def test_a_first_revision_skips_the_diff_loudly(repo: Path, tmp_path: Path) -> None:
    commit_all(repo, first_empty=True)
    log = str(decision_log(tmp_path / "decisions.jsonl"))
    first = policy_ci(repo, LIVE_REF="HEAD~1", DECISION_LOG=log)
    assert first.returncode == 0, first.stdout + first.stderr
    assert re.search(r"!!! diff SKIPPED: LIVE_REF HEAD~1 \([0-9a-f]{12}\) holds no policies/\.manifest, a first revision", first.stderr), first.stderr
    required = policy_ci(repo, LIVE_REF="HEAD~1", DECISION_LOG=log, REQUIRE_DIFF="true")
    assert required.returncode == 1 and "REQUIRE_DIFF is true" in required.stderr


def test_the_workflow_requires_a_signature_on_main_and_approval_on_the_labeled_run_only(initialised: tuple[Path, subprocess.CompletedProcess]) -> None:
    workflow = yaml.safe_load((initialised[0] / ".github/workflows/policy.yml").read_text())
    env = workflow["jobs"]["policy"]["steps"][-2]["env"]
    assert "REQUIRE_ALL_STEPS" not in env
    assert env["REQUIRE_SIGNATURE"] == "${{ github.event_name == 'push' }}"
    assert env["REQUIRE_DIFF"] == "${{ vars.REQUIRE_DIFF || 'false' }}"
    # a label left on across pushes approves nothing: only the run of its `labeled` event
    assert "labels.*" not in env["ALLOW_WIDENING"]
    assert "github.event.action == 'labeled' && github.event.label.name == 'policy-widening-approved'" in env["ALLOW_WIDENING"]
    assert env["ALLOW_WIDENING"].startswith("${{ github.event_name == 'push' || ")  # main: reported, not refused
    # a new branch's `before` is all zeros: no live revision, not an unresolvable one
    assert "github.event.before != '" + "0" * 40 + "' && github.event.before || ''" in env["LIVE_REF"]
    assert workflow[True]["pull_request"]["types"] == ["opened", "synchronize", "reopened", "labeled", "unlabeled"]
