"""Bundle parsing and activation, in-process: every check that keeps a bad bundle
from serving, and the per-bundle index agreeing with the rules it speeds up."""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path

import pytest

from portcullis.engine.activation import activate
from portcullis.engine.bundle import BundleError, parse_bundle, read_bundle_files, write_tarball
from portcullis.engine.rego import Policy
from tests.bundles import CATALOG, TENANTS, deep_copy, write_bundle

PROVIDERS = {"anthropic-us", "anthropic-eu", "openai-main"}
TODAY = dt.date(2026, 11, 30)


def load(directory: Path, providers=PROVIDERS):
    return activate(parse_bundle(read_bundle_files(directory), []), providers, TODAY)


def test_default_bundle_of_the_repository_activates() -> None:
    root = Path(__file__).resolve().parent.parent / "policies"
    active = activate(parse_bundle(read_bundle_files(root), []), {"mock"}, TODAY)
    assert active.revision and active.decide({"principal": {"team": "demo", "user": None}, "request": {"model": "sonnet", "requires": []}}).allow


def test_directory_and_tarball_give_the_same_bundle(tmp_path: Path) -> None:
    directory = write_bundle(tmp_path / "b")
    tarball = tmp_path / "b.tar.gz"
    tarball.write_bytes(write_tarball(read_bundle_files(directory)))
    assert parse_bundle(read_bundle_files(tarball), []).digest == parse_bundle(read_bundle_files(directory), []).digest


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t, c: c["models"]["claude-opus-4-1"]["targets"][0].pop("region"), "'region' is a required property"),
        (
            lambda t, c: c["models"]["claude-opus-4-1"]["targets"][0].update(priority="high"),
            "data.portcullis.catalog.models.claude-opus-4-1.targets[0].priority",
        ),
        (lambda t, c: c["aliases"].update({"gpt-4o-mini": "claude-opus-4-1"}), "shadows the canonical model"),
        (lambda t, c: c["aliases"].update({"x": "nothing"}), "points at unknown model"),
        (lambda t, c: c["models"]["claude-haiku-4-5"].update(fallbacks=["claude-haiku-4-5"]), "is not another known model"),
        (lambda t, c: c["models"]["claude-opus-4-1"]["targets"][0].update(provider="azure"), "'azure' is not a configured provider"),
        (lambda t, c: c["prices"][0].update(usd_per_mtok={"input": 3, "output": "15"}), "usd_per_mtok.input"),
        (lambda t, c: t["teams"]["eng"].update(model=["*"]), "Additional properties are not allowed"),
    ],
)
def test_data_errors_name_the_field(tmp_path: Path, mutate, message: str) -> None:
    tenants, catalog = deep_copy(TENANTS), deep_copy(CATALOG)
    mutate(tenants, catalog)
    with pytest.raises(BundleError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load(write_bundle(tmp_path / "b", tenants, catalog))


def test_writes_outside_the_manifest_roots_are_refused(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b", extra={"other/policy.rego": "package other\n\nx := 1\n"})
    with pytest.raises(BundleError, match="outside the manifest roots"):
        parse_bundle(read_bundle_files(bundle), [])


def test_a_policy_that_returns_malformed_plans_is_refused(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    (bundle / "portcullis" / "decision.rego").write_text('package portcullis\n\ndecision := {"allow": true}\n')
    with pytest.raises(BundleError, match="'reasons' is a required property"):
        load(bundle)


def test_the_index_and_the_rules_it_speeds_up_agree(tmp_path: Path) -> None:
    """Differential check: decisions read from the per-bundle index equal decisions
    the rules compute from the raw data, for every team, user, name and requirement."""
    active = load(write_bundle(tmp_path / "b"))
    plain = Policy(active.bundle.modules, active.bundle.data)
    principals = [("eng", None), ("eng", "carol"), ("eng", "dave"), ("eng", "nobody"), ("eu-team", None), ("sonnet-only", None), ("ghost", None)]
    names = [*CATALOG["models"], *CATALOG["aliases"], "unknown"]
    requirements = [[], ["streaming"], ["tools", "streaming"], ["vision", "thinking"]]
    for (team, user), name, requires in itertools.product(principals, names, requirements):
        document = {"principal": {"team": team, "user": user, "key_id": "k"}, "request": {"model": name, "requires": requires, "protocol": "openai_chat"}}
        assert active.policy.evaluate("data.portcullis.decision", document) == plain.evaluate("data.portcullis.decision", document), document
    for team, user in principals:
        document = {"principal": {"team": team, "user": user}}
        assert active.policy.evaluate("data.portcullis.visible_models", document) == plain.evaluate("data.portcullis.visible_models", document)


def test_decisions_are_cached_only_for_deterministic_policies(tmp_path: Path) -> None:
    document = {"principal": {"team": "eng", "user": None, "key_id": "k"}, "request": {"model": "sonnet", "requires": []}}
    cached = load(write_bundle(tmp_path / "plain"))
    assert cached.caches_decisions and cached.decide(document) is cached.decide(document)
    clocked = load(write_bundle(tmp_path / "clocked", extra={"portcullis/hours.rego": "package portcullis\n\nbusiness_hours if time.now_ns() > 0\n"}))
    assert not clocked.caches_decisions and clocked.decide(document) == clocked.decide(document)
    assert clocked.decide(document) is not clocked.decide(document)


def test_yaml_aliases_are_refused_before_they_can_expand(tmp_path: Path) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n" for i in range(8)
    )
    bundle = write_bundle(tmp_path / "b", extra={"portcullis/bomb/data.yaml": bomb})
    with pytest.raises(BundleError, match="aliases are not allowed"):
        parse_bundle(read_bundle_files(bundle), [])
