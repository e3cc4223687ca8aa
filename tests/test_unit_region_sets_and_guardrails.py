"""Region sets and Bedrock guardrails, from bundle data to the typed plan: activation
refuses a cross-region inference profile whose regions are not declared, a region
lock holds for the whole set, and the guardrail the policy requires reaches the plan
and its audit view."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from portcullis.engine.activation import ActiveBundle, activate
from portcullis.engine.bundle import BundleError, parse_bundle, read_bundle_files
from portcullis.engine.catalog import routes_across_regions
from portcullis.engine.errors import ErrorKind
from portcullis.engine.guardrail import Guardrail
from portcullis.engine.target import Target
from tests.bundles import APAC_PROFILE_REGIONS, CATALOG, REFERENCE_PROVIDERS, TENANTS, deep_copy, reference_catalog, target, write_bundle

PROVIDERS = {"anthropic-us", "anthropic-eu", "openai-main", *REFERENCE_PROVIDERS}
TODAY = dt.date(2026, 11, 30)
STRICT = {"identifier": "gr0strict", "version": "3", "trace": "enabled"}


def load(directory: Path) -> ActiveBundle:
    return activate(parse_bundle(read_bundle_files(directory), []), PROVIDERS, TODAY)


def decide(active: ActiveBundle, team: str, model: str = "claude-sonnet-4-5"):
    return active.decide({"principal": {"team": team, "user": None, "key_id": "k"}, "request": {"model": model, "requires": []}})


def with_opus_target(**changes: Any) -> dict[str, Any]:
    catalog = deep_copy(CATALOG)
    catalog["models"]["claude-opus-4-1"]["targets"][0].update(changes)
    price = {"provider": "anthropic-us", "model": changes["model"], "effective_from": "2025-01-01", "usd_per_mtok": {"input": "1", "output": "5"}}
    catalog["prices"].append(price)
    return catalog


@pytest.mark.parametrize(
    "model",
    [
        "us.anthropic.claude-opus-4-1-20250805-v1:0",
        "eu.anthropic.claude-opus-4-1-20250805-v1:0",
        "apac.anthropic.claude-opus-4-1-20250805-v1:0",
        "global.anthropic.claude-opus-4-1-20250805-v1:0",
        "us-gov.anthropic.claude-opus-4-1-20250805-v1:0",
        "jp.anthropic.claude-opus-4-1-20250805-v1:0",
        "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-opus-4-1-20250805-v1:0",
        "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3d4e5f6",
    ],
)
def test_activation_refuses_a_profile_without_its_regions_naming_model_and_target(tmp_path: Path, model: str) -> None:
    with pytest.raises(BundleError) as refused:
        load(write_bundle(tmp_path / "b", catalog=with_opus_target(model=model)))
    message = str(refused.value)
    assert "catalog.models.claude-opus-4-1.targets[0]" in message and repr(model) in message
    assert "its region is ambiguous: declare the regions it may route to" in message


def test_a_declared_profile_activates_and_an_ordinary_model_id_needs_no_set(tmp_path: Path) -> None:
    load(write_bundle(tmp_path / "b", catalog=with_opus_target(model="us.anthropic.claude-opus-4-1-v1:0", regions=["us-east-1", "us-west-2"])))
    assert not routes_across_regions("anthropic.claude-opus-4-1-20250805-v1:0")
    assert not routes_across_regions("arn:aws:bedrock:us-east-1::foundation-model/anthropic.claude-opus-4-1-20250805-v1:0")
    assert not routes_across_regions("user.defined-model")  # a prefix only when it is a whole geography


def test_activation_refuses_a_region_set_without_the_targets_region(tmp_path: Path) -> None:
    catalog = with_opus_target(model="us.anthropic.claude-opus-4-1-v1:0", regions=["us-west-2"])
    with pytest.raises(BundleError, match=r"targets\[0\]\.regions: does not include the target's region 'us-east-1'"):
        load(write_bundle(tmp_path / "b", catalog=catalog))


def test_a_region_lock_admits_a_profile_only_when_its_whole_set_is_inside(tmp_path: Path) -> None:
    tenants = deep_copy(TENANTS)
    tenants["teams"]["apac"] = {"models": ["claude-*"], "regions": APAC_PROFILE_REGIONS}
    tenants["teams"]["seoul"] = {"models": ["claude-*"], "regions": ["ap-northeast-2", "us-east-1"]}
    active = load(write_bundle(tmp_path / "b", tenants, reference_catalog()))

    apac = decide(active, "apac")
    assert [t.provider for t in apac.targets] == ["bedrock-apne2"]
    assert apac.targets[0].regions == tuple(APAC_PROFILE_REGIONS) and apac.targets[0].region == "ap-northeast-2"
    assert apac.targets[0].describe()["regions"] == APAC_PROFILE_REGIONS
    assert apac.audit_view()["targets"] == [f"bedrock-apne2/apac.anthropic.claude-sonnet-4-5-20250929-v1:0@ap-northeast-2[{','.join(APAC_PROFILE_REGIONS)}]"]

    seoul = decide(active, "seoul")  # its home region is allowed, the rest of its set is not
    assert [t.provider for t in seoul.targets] == ["anthropic-us"] and "regions" not in seoul.targets[0].describe()
    rejected = {t["provider"]: t for t in seoul.audit_view()["rejected_targets"]}
    assert rejected["bedrock-apne2"]["reasons"] == ["region_not_allowed"] and rejected["bedrock-apne2"]["regions"] == APAC_PROFILE_REGIONS
    assert "regions" not in rejected["bedrock-usw2"]

    everywhere = decide(active, "eng")
    assert [t.provider for t in everywhere.targets] == [*REFERENCE_PROVIDERS, "anthropic-eu"]  # then the fallback model


def test_an_ordinary_target_has_its_region_as_its_set() -> None:
    entry = {**target("anthropic-us", "claude-sonnet-4-5-20250929", "us-east-1"), "canonical_model": "claude-sonnet-4-5"}
    parsed = Target.from_plan(entry)
    assert parsed.regions == ("us-east-1",) and "regions" not in parsed.describe()
    assert Target("m", "p", "m", "eu-west-1", 1, 1000, 100, ()).regions == ("eu-west-1",)


def test_a_team_guardrail_reaches_the_typed_plan_and_its_audit_view(tmp_path: Path) -> None:
    tenants = deep_copy(TENANTS)
    tenants["teams"]["eng"]["guardrail"] = STRICT
    active = load(write_bundle(tmp_path / "b", tenants, reference_catalog()))
    plan = decide(active, "eng")
    assert plan.allow and plan.guardrail == Guardrail("gr0strict", "3", "enabled")
    assert plan.audit_view()["guardrail"] == STRICT
    unguarded = decide(active, "eu-team")
    assert unguarded.guardrail is None and "guardrail" not in unguarded.audit_view()


def test_a_model_guardrail_defaults_to_no_trace(tmp_path: Path) -> None:
    catalog = reference_catalog()
    catalog["models"]["claude-sonnet-4-5"]["guardrail"] = {"identifier": "arn:aws:bedrock:ap-northeast-2:123456789012:guardrail/gr0model", "version": "DRAFT"}
    plan = decide(load(write_bundle(tmp_path / "b", catalog=catalog)), "eng")
    assert plan.guardrail == Guardrail("arn:aws:bedrock:ap-northeast-2:123456789012:guardrail/gr0model", "DRAFT", "disabled")


def test_conflicting_guardrails_are_refused_without_naming_either(tmp_path: Path) -> None:
    tenants, catalog = deep_copy(TENANTS), reference_catalog()
    tenants["teams"]["eng"]["guardrail"] = STRICT
    catalog["models"]["claude-sonnet-4-5"]["guardrail"] = {"identifier": "gr0lenient", "version": "1"}
    plan = decide(load(write_bundle(tmp_path / "b", tenants, catalog)), "eng")
    assert not plan.allow and plan.guardrail is None
    error = plan.refusal()
    assert error.kind == ErrorKind.PERMISSION and error.code == "guardrail_conflict"
    assert "gr0" not in str(error)  # the bundle's guardrail ids are not the client's to read


@pytest.mark.parametrize(
    ("guardrail", "message"),
    [
        ({"identifier": "gr0strict", "version": 1}, "1 is not of type 'string'"),
        ({"identifier": "gr0strict", "version": "latest"}, "'latest' does not match"),
        ({"identifier": "gr0strict", "version": "1", "trace": "on"}, "'on' is not one of"),
        ({"identifier": "Not An Id", "version": "1"}, "'Not An Id' does not match"),
        ({"version": "1"}, "'identifier' is a required property"),
    ],
)
def test_a_malformed_guardrail_is_refused_at_activation(tmp_path: Path, guardrail: dict[str, Any], message: str) -> None:
    tenants = deep_copy(TENANTS)
    tenants["teams"]["eng"]["guardrail"] = guardrail
    with pytest.raises(BundleError, match=message):
        load(write_bundle(tmp_path / "b", tenants))
