"""`portcullis policy diff`: recorded decision inputs replayed against two bundles, each
change sorted into the kind a reviewer asks about — a grant widened for one principal,
a narrowing, a region added, limits, PII actions, tool rules — with counts, examples and
the principals affected; `--fail-on widen|any` as a CI gate; decision logs read as the
gateway writes them (JSONL, gzip, the HTTP sink's arrays, masked), and a damaged log is
a clear error."""

from __future__ import annotations

import copy
import datetime as dt
import gzip
import json
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from portcullis.adapters.cli.offline_bundle import activated
from portcullis.adapters.decision_logs.config import DecisionLogsConfig
from portcullis.adapters.decision_logs.logger import DecisionLogger, PendingDecision
from portcullis.engine.activation import ActiveBundle
from portcullis.engine.decision_changes import Outcome, changes
from portcullis.engine.decision_log import parse_pointer
from portcullis.engine.policy_diff import Replay
from tests.bundles import CATALOG, TENANTS, write_bundle
from tests.pii_helpers import REGULATED

ROOT = Path(__file__).resolve().parent.parent
SONNET_US = "anthropic-us/claude-sonnet-4-5-20250929@us-east-1"
SONNET_EU = "anthropic-eu/claude-sonnet-4-5-20250929@eu-west-1"
HAIKU_EU = "anthropic-eu/claude-haiku-4-5-20251001@eu-west-1"


def request(team: str, user: str | None, model: str = "sonnet", tools: Iterable[str] = ()) -> dict[str, Any]:
    return {
        "principal": {"team": team, "user": user, "key_id": f"key-{team}"},
        "request": {"protocol": "anthropic_messages", "model": model, "stream": False, "max_tokens": 100, "requires": [], "tools": list(tools)},
    }


RESEARCH_RATE = {"research-rate": {"subject": {"team": "research"}, "rate": {"rpm": 60}}}
TRAFFIC = [
    request("eng", "carol"),  # carol's own grant narrows claude to haiku: refused
    request("eng", "carol", "haiku"),
    request("eng", "dave"),
    request("eng", None, "mini"),
    request("eu-team", None),
    request("sonnet-only", None),
    request("sonnet-only", None, "haiku"),  # not granted: refused
]


def events(documents: Iterable[dict[str, Any]], revision: str = "test-1") -> list[dict[str, Any]]:
    """Decision-log events as the file sink writes them (``input`` is what was decided)."""
    return [
        {
            "decision_id": f"req-{number}",
            "labels": {"id": "gw-1", "app": "portcullis"},
            "bundles": {"portcullis": {"revision": revision}},
            "path": "portcullis/decision",
            "input": document,
            "result": {},
            "timestamp": "2026-12-01T10:00:00.000000000Z",
        }
        for number, document in enumerate(documents, 1)
    ]


def write_log(path: Path, entries: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    return path


def policy_diff(old: Path, new: Path, log: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "portcullis.adapters.cli", "policy", "diff", str(old), str(new), "--inputs", str(log), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The base bundle and changed copies of it, written once for the module."""
    root = tmp_path_factory.mktemp("diff")
    widened = copy.deepcopy(TENANTS)
    del widened["teams"]["eng"]["users"]["carol"]  # carol gets the whole team's grant
    narrowed = copy.deepcopy(TENANTS)
    narrowed["teams"]["sonnet-only"]["models"] = []
    unlocked = copy.deepcopy(TENANTS)
    unlocked["teams"]["eu-team"].pop("regions")
    new_team = copy.deepcopy(TENANTS)
    new_team["teams"]["research"] = {"models": ["claude-*"]}
    return {
        "base": write_bundle(root / "base"),
        "widened": write_bundle(root / "widened", widened, revision="test-2"),
        "narrowed": write_bundle(root / "narrowed", narrowed, revision="test-2"),
        "unlocked": write_bundle(root / "unlocked", unlocked, revision="test-2"),
        "new_team": write_bundle(root / "new_team", new_team, revision="test-2", governance=RESEARCH_RATE),
    }


def replay(old: Path | ActiveBundle, new: Path | ActiveBundle, documents: Iterable[dict[str, Any]]) -> dict[str, Any]:
    old_bundle = old if isinstance(old, ActiveBundle) else activated(old, None)
    new_bundle = new if isinstance(new, ActiveBundle) else activated(new, None)
    return Replay(old_bundle, new_bundle).add_all(events(documents)).as_json()


# --- the gate -----------------------------------------------------------------------------


def test_a_grant_widened_for_one_user_is_caught_by_fail_on_widen(bundles: dict[str, Path], tmp_path: Path) -> None:
    log = write_log(tmp_path / "decisions.jsonl", events(TRAFFIC))
    result = policy_diff(bundles["base"], bundles["widened"], log, "--fail-on", "widen")
    assert result.returncode == 1, result.stdout + result.stderr
    text = result.stdout
    assert "replayed 7 decisions: 1 changed, 6 unchanged" in text
    assert "refused → allowed (deny_to_allow): 1  [widens]" in text
    assert "principals: eng/carol (1)" in text
    assert "- req-1  eng/carol  model sonnet: model_not_allowed → allowed" in text
    assert "FAIL (--fail-on widen): deny_to_allow" in text
    report = json.loads(policy_diff(bundles["base"], bundles["widened"], log, "--format", "json").stdout)
    assert list(report["changes"]) == ["deny_to_allow"]
    group = report["changes"]["deny_to_allow"]
    assert group["count"] == 1 and group["principals"] == {"eng/carol": 1}
    assert group["examples"][0]["new"] == {"allow": True, "model": "claude-sonnet-4-5", "targets": [SONNET_US, SONNET_EU, HAIKU_EU]}
    assert report["old"]["revision"] == "test-1" and report["new"]["revision"] == "test-2"
    assert report["caught"] == [] and report["inputs"]["recorded_revisions"] == {"test-1": 7}
    assert policy_diff(bundles["base"], bundles["widened"], log).returncode == 0  # no gate, only the report


def test_a_narrowing_passes_the_widening_gate_but_not_the_strict_one(bundles: dict[str, Path], tmp_path: Path) -> None:
    log = write_log(tmp_path / "decisions.jsonl", events(TRAFFIC))
    gated = policy_diff(bundles["base"], bundles["narrowed"], log, "--fail-on", "widen")
    assert gated.returncode == 0, gated.stdout + gated.stderr
    assert "allowed → refused (allow_to_deny): 1" in gated.stdout
    assert "principals: sonnet-only (1)" in gated.stdout
    assert "ok (--fail-on widen): nothing to refuse" in gated.stdout
    strict = policy_diff(bundles["base"], bundles["narrowed"], log, "--fail-on", "any")
    assert strict.returncode == 1 and "FAIL (--fail-on any): allow_to_deny" in strict.stdout


def test_the_same_bundle_changes_nothing(bundles: dict[str, Path], tmp_path: Path) -> None:
    log = write_log(tmp_path / "decisions.jsonl", events(TRAFFIC))
    result = policy_diff(bundles["base"], bundles["base"], log, "--fail-on", "any")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "replayed 7 decisions: 0 changed, 7 unchanged" in result.stdout and "no decision changes" in result.stdout


# --- the kinds of change ------------------------------------------------------------------


def test_a_region_lock_lifted_adds_a_region_and_changes_the_targets(bundles: dict[str, Path]) -> None:
    report = replay(bundles["base"], bundles["unlocked"], TRAFFIC)
    assert set(report["changes"]) == {"targets", "provider_added", "region_added"}
    assert report["changes"]["provider_added"]["examples"][0]["change"] == "anthropic-us"
    added = report["changes"]["region_added"]
    assert added["widens"] and added["principals"] == {"eu-team": 1} and added["examples"][0]["change"] == "us-east-1"
    assert report["changes"]["targets"]["examples"][0]["change"] == f"{SONNET_EU}, {HAIKU_EU} → {SONNET_US}, {SONNET_EU}, {HAIKU_EU}"


def test_inputs_replay_under_a_bundle_whose_index_changed(bundles: dict[str, Path]) -> None:
    """A team the old bundle did not know: its compiled index (teams' rules and limits)
    is the new bundle's own, so the recorded input is decided as that bundle would."""
    report = replay(bundles["base"], bundles["new_team"], [*TRAFFIC, request("research", "erin")])
    assert list(report["changes"]) == ["deny_to_allow"]
    example = report["changes"]["deny_to_allow"]["examples"][0]
    assert example["principal"] == "research/erin" and example["change"] == "unknown_team → allowed"
    research = activated(bundles["new_team"], None).decide(request("research", "erin"))
    assert [(c.scope, c.block) for c in research.limits.counters] == [("team:research", 60)]


def test_limits_looser_and_tighter(tmp_path: Path) -> None:
    def rules(rpm: int, tpm: int) -> dict[str, Any]:
        return {"eng-rate": {"subject": {"team": "eng"}, "rate": {"rpm": rpm, "tpm": tpm}}}

    old = write_bundle(tmp_path / "old", governance=rules(100, 50000))
    new = write_bundle(tmp_path / "new", governance=rules(200, 20000))
    report = replay(old, new, [request("eng", "dave"), request("eu-team", None)])
    assert report["changes"]["limit_looser"]["examples"][0]["change"] == "team:eng requests/minute: 100 → 200"
    assert report["changes"]["limit_tighter"]["examples"][0]["change"] == "team:eng tokens/minute: 50000 → 20000"
    assert report["changes"]["limit_looser"]["principals"] == {"eng/dave": 1}
    removed = replay(old, write_bundle(tmp_path / "none"), [request("eng", "dave")])
    looser = [e["change"] for e in removed["changes"]["limit_looser"]["examples"]]
    assert looser == ["team:eng requests/minute: 100 → no limit", "team:eng tokens/minute: 50000 → no limit"]


def test_pii_actions_weaker_and_stricter(tmp_path: Path) -> None:
    changed = copy.deepcopy(REGULATED)
    changed["actions"]["EMAIL"] = "mask"  # pseudonymize → mask: weaker
    changed["actions"]["IP_ADDRESS"] = "block"  # redact → block: stricter
    del changed["actions"]["SECRET"]  # block → nothing: weaker
    old = write_bundle(tmp_path / "old", copy.deepcopy(TENANTS), copy.deepcopy(CATALOG), pii={"regulated": REGULATED})
    new = write_bundle(tmp_path / "new", copy.deepcopy(TENANTS), copy.deepcopy(CATALOG), pii={"regulated": changed})
    report = replay(old, new, [request("eng", "dave")])
    assert [e["change"] for e in report["changes"]["pii_weaker"]["examples"]] == ["EMAIL: pseudonymize → mask", "SECRET: block → none"]
    assert [e["change"] for e in report["changes"]["pii_stricter"]["examples"]] == ["IP_ADDRESS: redact → block"]
    assert report["changes"]["pii_weaker"]["widens"] and not report["changes"]["pii_stricter"]["widens"]


def test_tool_rules_that_stop_applying_are_a_widening(tmp_path: Path) -> None:
    def integrity(deny: list[str], declared_only: bool) -> dict[str, Any]:
        return {"agents": {"teams": ["eng"], "tools": {"deny": deny, "declared_only": declared_only}}}

    old = write_bundle(tmp_path / "old", integrity=integrity(["credential-files", "destructive-command"], True))
    new = write_bundle(tmp_path / "new", integrity=integrity(["credential-files"], False))
    report = replay(old, new, [request("eng", "dave", tools=["bash"])])
    looser = [e["change"] for e in report["changes"]["tools_looser"]["examples"]]
    assert looser[0] == "declared tools only" and looser[1].startswith("deny rule destructive-command (")
    assert report["changes"]["tools_looser"]["widens"] and "tools_tighter" not in report["changes"]


def test_kinds_of_a_single_comparison() -> None:
    def allowed(model: str, **extra: Any) -> Outcome:
        return Outcome(True, "allowed", model, ("p/m@r",), frozenset({"p"}), frozenset({"r"}), **extra)

    def refused(reason: str) -> Outcome:
        return Outcome(False, reason)

    assert changes(allowed("a"), allowed("b")) == [("model", "a → b")]
    assert changes(refused("model_not_allowed"), refused("unknown_model")) == [("refusal_reason", "model_not_allowed → unknown_model")]
    assert changes(refused("model_not_allowed"), refused("model_not_allowed")) == []
    assert changes(refused("model_not_allowed"), allowed("a")) == [("deny_to_allow", "model_not_allowed → allowed")]
    assert changes(allowed("a"), "policy error: x") == [("undecidable", "allowed → policy error: x")]
    assert changes("policy error: x", allowed("a")) == [("deny_to_allow", "policy error: x → allowed")]
    assert changes("policy error: x", refused("unknown_model")) == [("refusal_reason", "policy error: x → unknown_model")]
    assert changes("policy error: x", "policy error: y") == []
    hard, soft = allowed("a", limits={"team:t cost/month": (10, True)}), allowed("a", limits={"team:t cost/month": (10, False)})
    assert changes(hard, soft) == [("limit_looser", "team:t cost/month: hard → soft")]
    assert changes(allowed("a", document='{"x": 1}'), allowed("a", document='{"x": 2}')) == [("plan_other", "x")]

    # every policy judging URLs must allow a host: a list fewer lets more through
    def hosts(*lists: str) -> Outcome:
        judged = {"output": {}, "scan": {}, "thresholds": {}, "spotlight": frozenset(), "canaries": frozenset(), "prompt": None, "injection_rules": frozenset()}
        return allowed("a", integrity=judged | {"allowed_hosts": frozenset(lists)})

    assert changes(hosts("docs.example.com", "*.example.com"), hosts("*.example.com")) == [("integrity_weaker", "no allowed-host list docs.example.com")]

    # the fields the PII filter can transform: one more lets personal data found there leave
    def fields(*names: str) -> Outcome:
        pii = {"actions": {}, "on_error": "fail_closed", "unsupported": "block", "restore_tokens": False, "min_score": 0.5, "detectors": frozenset()}
        return allowed("a", pii=pii | {"fields": frozenset(names)})

    assert changes(fields("text"), fields("text", "tool_results")) == [("pii_weaker", "transformable field tool_results")]


# --- decision logs as the gateway writes them -----------------------------------------------


def logged(bundle: ActiveBundle, documents: list[dict[str, Any]], mask: str) -> list[dict[str, Any]]:
    """Events made by the gateway's own logger from plans ``bundle`` decided."""
    logger = DecisionLogger(DecisionLogsConfig(mask=(parse_pointer(mask),)), None, None, labels={"id": "gw-1"})
    written = []
    for number, document in enumerate(documents, 1):
        plan = bundle.decide(document)
        arrived = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
        written.append(logger.event(PendingDecision(f"req-{number}", plan.source_input, plan.source, bundle.revision, bundle.digest, arrived)))
    return written


def test_decision_logs_as_written_are_read_from_jsonl_gzip_and_the_http_sinks_arrays(bundles: dict[str, Path], tmp_path: Path) -> None:
    """Every form of the log replays alike, and the old bundle reproduces each decision it recorded."""
    written = logged(activated(bundles["base"], None), TRAFFIC, "/input/request/stream")
    lines = "".join(json.dumps(event) + "\n" for event in written).encode()
    (tmp_path / "log.jsonl").write_bytes(lines)
    (tmp_path / "log.jsonl.gz").write_bytes(gzip.compress(lines))
    (tmp_path / "batches.json").write_text(json.dumps(written[:3]) + "\n" + json.dumps(written[3:]) + "\n")
    reports = []
    for name in ("log.jsonl", "log.jsonl.gz", "batches.json"):
        result = policy_diff(bundles["base"], bundles["narrowed"], tmp_path / name, "--format", "json")
        assert result.returncode == 0, result.stderr
        reports.append(json.loads(result.stdout))
    assert reports[0] == reports[1] == reports[2]
    inputs = reports[0]["inputs"]
    assert inputs["replayed"] == 7 and inputs["masked"] == 7 and inputs["recorded_revisions"] == {"test-1": 7}
    assert inputs["reproduced"] == 7 and inputs["diverged"] == 0
    assert reports[0]["changes"]["allow_to_deny"]["principals"] == {"sonnet-only": 1}


def test_inputs_masked_of_what_the_policy_reads_are_reported_as_diverged(bundles: dict[str, Path], tmp_path: Path) -> None:
    """Without the user the policy cannot decide as it did: the old bundle's replay of its
    own decisions says so, rather than passing the change off as compared."""
    log = write_log(tmp_path / "decisions.jsonl", logged(activated(bundles["base"], None), TRAFFIC, "/input/principal/user"))
    result = policy_diff(bundles["base"], bundles["widened"], log)
    assert result.returncode == 0, result.stderr
    assert "7 masked (replayed without the erased values)" in result.stdout
    assert "warning: the old bundle decided 7 of the 7 decisions it recorded differently on replay" in result.stdout


def test_a_damaged_or_empty_log_is_a_clear_error(bundles: dict[str, Path], tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    log.write_text(json.dumps(events(TRAFFIC[:1])[0]) + "\n{not json\n")
    result = policy_diff(bundles["base"], bundles["base"], log)
    assert result.returncode == 1 and f"{log}:2: not JSON" in result.stderr and "Traceback" not in result.stderr
    other = events(TRAFFIC[:1])[0] | {"path": "portcullis/visible_models"}
    write_log(log, [other, {"decision_id": "x", "path": "portcullis/decision", "input": {"principal": "eng"}}])
    empty = policy_diff(bundles["base"], bundles["base"], log)
    assert empty.returncode == 1 and "no decisions to replay" in empty.stderr and "of 2 events" in empty.stderr
    (tmp_path / "cut.gz").write_bytes(gzip.compress(b'{"a": 1}\n' * 100)[:30])
    cut = policy_diff(bundles["base"], bundles["base"], tmp_path / "cut.gz")
    assert cut.returncode == 1 and "cannot be read" in cut.stderr and "Traceback" not in cut.stderr
    missing = policy_diff(bundles["base"], tmp_path / "nowhere", log)
    assert missing.returncode == 1 and "nowhere: no such file or directory" in missing.stderr


def test_the_live_bundle_may_be_the_signed_tarball_the_gateway_serves(bundles: dict[str, Path], tmp_path: Path) -> None:
    """A signature says who made a bundle, not what it decides: diff sets it aside, and the
    signed tarball keeps the digest its directory has (and the decision log names)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    signed = tmp_path / "signed"
    shutil.copytree(bundles["base"], signed)
    cli = [sys.executable, "-m", "portcullis.adapters.cli", "policy"]
    for step in (["sign", str(signed), "--signing-key", str(tmp_path / "key.pem")], ["build", str(signed), "-o", str(tmp_path / "live.tar.gz")]):
        assert subprocess.run([*cli, *step], capture_output=True, text=True, timeout=60, cwd=ROOT).returncode == 0
    log = write_log(tmp_path / "decisions.jsonl", events(TRAFFIC))
    result = policy_diff(tmp_path / "live.tar.gz", bundles["widened"], log, "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["old"]["digest"] == activated(bundles["base"], None).digest
    assert report["changes"]["deny_to_allow"]["principals"] == {"eng/carol": 1}


def test_what_else_a_plan_enforces_is_compared(tmp_path: Path) -> None:
    """Restoring tokens, unsupported content, the output guard, a tool rule's definition,
    an internal target: each weakening is a widening; a new policy prompt is a change."""
    readers = copy.deepcopy(REGULATED) | {"token_readers": ["eng/carol", "eng/dave"]}
    rules = yaml.safe_load((ROOT / "policies" / "portcullis" / "integrity" / "data.yaml").read_text())
    agents = {
        "teams": ["eng"],
        "tools": {"deny": ["credential-files"]},
        "output": {"actions": {"secrets": "redact"}},
        "prompt": {"version": "1", "text": "Be careful."},
    }
    old_integrity = {"tool_rules": rules["tool_rules"], "policies": {"agents": agents}}
    new_integrity = copy.deepcopy(old_integrity)
    new_integrity["tool_rules"][2]["pattern"] = "never-matches-anything"  # same id, narrower rule
    new_integrity["policies"]["agents"]["output"]["actions"]["secrets"] = "flag"
    new_integrity["policies"]["agents"]["prompt"]["text"] = "Be very careful."
    internal = copy.deepcopy(CATALOG)
    internal["models"]["claude-sonnet-4-5"]["targets"][1]["internal"] = True
    common = {"tenants": copy.deepcopy(TENANTS)}
    old = write_bundle(tmp_path / "old", catalog=copy.deepcopy(CATALOG), pii={"regulated": REGULATED}, sections={"integrity": old_integrity}, **common)
    new = write_bundle(tmp_path / "new", catalog=internal, pii={"regulated": readers}, sections={"integrity": new_integrity}, **common)
    report = replay(old, new, [request("eng", "dave")])
    details = {kind: [e["change"] for e in group["examples"]] for kind, group in report["changes"].items()}
    assert details["pii_weaker"] == ["restore_tokens: False → True"]
    assert details["integrity_weaker"] == ["output secrets: redact → flag"]
    assert details["provider_added"] == [f"{SONNET_EU} (internal)"]
    assert len(details["tools_looser"]) == 1 and details["tools_looser"][0].startswith("deny rule credential-files (")
    assert len(details["tools_tighter"]) == 1  # the same id with its new definition
    prompt_only = copy.deepcopy(old_integrity)
    prompt_only["policies"]["agents"]["prompt"]["text"] = "Be very careful."
    reworded = write_bundle(tmp_path / "reworded", catalog=copy.deepcopy(CATALOG), pii={"regulated": REGULATED}, sections={"integrity": prompt_only}, **common)
    assert replay(old, reworded, [request("eng", "dave")])["changes"]["plan_other"]["examples"][0]["change"] == "the policy prompt's text"
    # the canary is what the output guard looks for; the scanner's rules are the bundle's, not the plan's
    scanned = copy.deepcopy(old_integrity)
    scanned["policies"]["agents"] |= {
        "prompt": {"version": "1", "text": "Be careful.", "canary": "PCX-CANARY-1"},
        "injection": {"threshold": 3, "surfaces": {"user": "block"}},
    }
    cut = copy.deepcopy(scanned)
    cut["policies"]["agents"]["prompt"].pop("canary")
    cut["injection_rules"] = [rule for rule in rules["injection_rules"] if rule["id"] != "override-instructions"]
    before = write_bundle(
        tmp_path / "scanned", catalog=copy.deepcopy(CATALOG), sections={"integrity": scanned | {"injection_rules": rules["injection_rules"]}}, **common
    )
    after = write_bundle(tmp_path / "cut", catalog=copy.deepcopy(CATALOG), sections={"integrity": cut}, **common)
    weaker = [e["change"] for e in replay(before, after, [request("eng", "dave")])["changes"]["integrity_weaker"]["examples"]]
    assert weaker[0] == "no canary PCX-CANARY-1" and weaker[1].startswith("no injection rule override-instructions (")


def test_a_masked_log_does_not_pass_the_gate_unless_accepted(bundles: dict[str, Path], tmp_path: Path) -> None:
    """Masking the user hides carol's widened grant from the replay: the gate says it could
    not compare, rather than passing it."""
    log = write_log(tmp_path / "decisions.jsonl", logged(activated(bundles["base"], None), TRAFFIC, "/input/principal/user"))
    gated = policy_diff(bundles["base"], bundles["widened"], log, "--fail-on", "widen")
    assert gated.returncode == 1, gated.stdout + gated.stderr
    assert "FAIL (--fail-on widen): uncompared" in gated.stdout and "--allow-masked accepts that" in gated.stdout
    accepted = policy_diff(bundles["base"], bundles["widened"], log, "--fail-on", "widen", "--allow-masked")
    assert accepted.returncode == 0 and "ok (--fail-on widen)" in accepted.stdout
    result_only = write_log(tmp_path / "results.jsonl", logged(activated(bundles["base"], None), TRAFFIC, "/result/reasons"))
    unmasked = json.loads(policy_diff(bundles["base"], bundles["widened"], result_only, "--format", "json", "--fail-on", "widen").stdout)
    assert unmasked["inputs"]["masked"] == 0 and unmasked["caught"] == ["deny_to_allow"]


def test_flags_examples_config_and_several_logs(bundles: dict[str, Path], tmp_path: Path) -> None:
    first = write_log(tmp_path / "a.jsonl", events(TRAFFIC[:3]))
    second = write_log(tmp_path / "b.jsonl", events([request("eng", "carol")] * 4, revision="test-0"))
    result = policy_diff(bundles["base"], bundles["widened"], first, "--inputs", str(second), "--examples", "1", "--format", "json")
    report = json.loads(result.stdout)
    group = report["changes"]["deny_to_allow"]
    assert group["count"] == 5 and len(group["examples"]) == 1 and group["principals"] == {"eng/carol": 5}
    assert report["inputs"]["recorded_revisions"] == {"test-1": 3, "test-0": 4}
    # the quickstart's gateway has one provider, mock: a bundle routing to others is one it would refuse
    quickstart = ROOT / "examples" / "quickstart" / "config.yaml"
    refused = policy_diff(bundles["base"], bundles["widened"], first, "--config", str(quickstart))
    assert refused.returncode == 1 and "cannot be loaded" in refused.stderr and "anthropic-us" in refused.stderr
    served = policy_diff(
        ROOT / "policies", ROOT / "policies", write_log(tmp_path / "demo.jsonl", events([request("demo", "bob")])), "--config", str(quickstart)
    )
    assert served.returncode == 0 and "1 unchanged" in served.stdout


def test_refusal_reasons_and_undecidable_inputs_through_the_command(bundles: dict[str, Path], tmp_path: Path) -> None:
    no_haiku = copy.deepcopy(CATALOG)
    del no_haiku["models"]["claude-haiku-4-5"]
    no_haiku["models"]["claude-sonnet-4-5"].pop("fallbacks")
    del no_haiku["aliases"]["haiku"]
    new = write_bundle(tmp_path / "no-haiku", copy.deepcopy(TENANTS), no_haiku, revision="test-2")
    log = write_log(tmp_path / "decisions.jsonl", events([request("sonnet-only", None, "haiku")]))
    result = policy_diff(bundles["base"], new, log, "--fail-on", "any")
    assert result.returncode == 1 and "refused for another reason (refusal_reason): 1" in result.stdout
    assert "model_not_allowed → unknown_model" in result.stdout


def test_odd_events_are_skipped_or_a_clear_error_never_a_traceback(bundles: dict[str, Path], tmp_path: Path) -> None:
    base = events(TRAFFIC[:1])[0]
    odd = [
        base | {"bundles": ["portcullis"], "erased": 5, "decision_id": "req-\ud800\x1b[31m"},
        base | {"input": {"principal": {"team": "eng", "user": {"id": 1}}, "request": {}}},
        base | {"input": {"principal": {"team": "eng", "user": "carol"}, "request": "sonnet"}},
    ]
    log = write_log(tmp_path / "odd.jsonl", odd)
    result = policy_diff(bundles["base"], bundles["widened"], log, "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["inputs"]["replayed"] == 1 and report["inputs"]["skipped"] == 2
    assert report["changes"]["deny_to_allow"]["examples"][0]["decision_id"] == "<unprintable name>"
    (tmp_path / "deep.jsonl").write_text("[" * 100000 + "]" * 100000 + "\n")
    deep = policy_diff(bundles["base"], bundles["base"], tmp_path / "deep.jsonl")
    assert deep.returncode == 1 and "deep.jsonl:1: nested deeper" in deep.stderr
    damaged = bytearray(gzip.compress(b'{"a": 1}\n' * 1000))
    damaged[20:40] = b"\xff" * 20
    (tmp_path / "damaged.gz").write_bytes(bytes(damaged))
    broken = policy_diff(bundles["base"], bundles["base"], tmp_path / "damaged.gz")
    assert broken.returncode == 1 and "cannot be read" in broken.stderr and "Traceback" not in broken.stderr
