"""``portcullis policy eval``: one request's decision as the gateway would make it, and
why, without a running gateway or a provider.

The body is parsed by the protocol's own parser (what ``adapters/ingress.py`` runs),
the input document is built by ``adapters/policy_input.py`` and decided by the bundle
loaded as the gateway loads it; then ``engine/explain.py`` reads the explanation off
the plan and the bundle's intermediate rules, and the context-fit layer (L5, decided
after the plan) is judged for each target with the gateway's own code.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from portcullis.adapters.cli.common import Failure, config_path, emit
from portcullis.adapters.protocols.registry import PATH_ACTIONS, ROUTE_NAMES


def register(policy: Any) -> None:
    evaluate = policy.add_parser("eval", help="decide one request as the gateway would, and explain the decision")
    source = evaluate.add_mutually_exclusive_group(required=True)
    source.add_argument("--request", type=Path, help="a request body (JSON), parsed as the gateway parses it")
    source.add_argument("--input", type=Path, help="a policy input document ({principal, request, facts}), decided as it is")
    evaluate.add_argument("--protocol", choices=sorted(ROUTE_NAMES), default="messages", help="the API the body is sent to (default: messages)")
    evaluate.add_argument("--principal", help="team[/user] the request is from (with --request)")
    evaluate.add_argument("--key-id", default="policy-eval", help="the API key's id (governance rules may name keys)")
    evaluate.add_argument("--model", help="converse/invoke: the model id of the path (/model/{id}/converse)")
    evaluate.add_argument("--stream", action="store_true", help="converse/invoke: the streaming operation")
    evaluate.add_argument("--header", action="append", default=[], metavar="NAME:VALUE", help="a request header (anthropic-beta, user-agent, ...)")
    evaluate.add_argument("--facts", type=Path, help="input.facts as JSON: features, session, classifier, budgets, breakers")
    evaluate.add_argument("--config", "-c", help="gateway configuration whose bundle, providers and limits are used")
    evaluate.add_argument("--bundle", type=Path, help="a bundle directory, loaded without a configuration (or instead of the configured one)")
    evaluate.add_argument("--format", choices=["pretty", "json"], default="pretty")
    evaluate.set_defaults(run=_policy_eval)


def _policy_eval(args: argparse.Namespace) -> int:
    from portcullis.engine.explain_text import render

    _check_flags(args)
    config = _config(args)
    bundle = _bundle(args, config)
    facts = _json_file(args.facts, "--facts") if args.facts else None
    if facts is not None and not isinstance(facts, dict):
        raise Failure(f"{args.facts}: the facts must be a JSON object")
    report = _from_request(args, config, bundle, facts) if args.request is not None else _from_input(args, bundle, facts)
    text = json.dumps(report, indent=2, ensure_ascii=False, default=str) if args.format == "json" else render(report)
    emit(text)
    return 0


def _check_flags(args: argparse.Namespace) -> None:
    """The flags that go together, checked before the bundle is loaded."""
    if args.request is not None and not args.principal:
        raise Failure("--request needs --principal team[/user]")
    if args.input is not None and (args.principal or args.header or args.model or args.stream):
        raise Failure("--input is decided as it is: --principal, --header, --model and --stream are for --request")


def _config(args: argparse.Namespace) -> Any:
    from portcullis.adapters.config import load_config

    if args.bundle is not None and args.config is None:
        return None
    return load_config(config_path(args.config, "bundle (--bundle)"))


def _bundle(args: argparse.Namespace, config: Any) -> Any:
    """The bundle as the gateway loads it: with the configuration's keys, providers and
    PII detectors; a --bundle alone is activated against the providers its own catalog names."""
    from portcullis.adapters.cli.offline_bundle import activated

    return activated(args.bundle, config)


def _json_file(path: Path, flag: str) -> Any:
    try:
        return json.loads(path.read_bytes())
    except OSError as error:
        raise Failure(f"{flag} {path}: {error.strerror}") from None
    except ValueError as error:
        raise Failure(f"{flag} {path}: not JSON ({error})") from None


def _from_request(args: argparse.Namespace, config: Any, bundle: Any, facts: dict[str, Any] | None) -> dict[str, Any]:
    from portcullis.adapters.auth import Principal
    from portcullis.adapters.policy_input import decide, input_document
    from portcullis.engine.errors import GatewayError

    team, _, user = args.principal.partition("/")
    if not team:
        raise Failure(f"--principal {args.principal!r}: give team or team/user")
    principal = Principal(args.key_id, team, user or None)
    request = _parsed(args, config)
    document = input_document(principal, request, facts)
    try:
        plan = decide(bundle, principal, request, facts)  # the gateway's own call
    except GatewayError as error:
        raise Failure(f"the policy could not decide: {error.message}") from None
    return _report(bundle, document, plan, lambda targets: _fit(bundle, config, request, targets))


def _parsed(args: argparse.Namespace, config: Any) -> Any:
    """The body as the gateway's ingress parses it (``protocol.parser``), with the
    session and client the executor reads from the headers."""
    from portcullis.adapters.ingress import session_of
    from portcullis.adapters.operations import Operation
    from portcullis.adapters.protocols.registry import protocol
    from portcullis.adapters.protocols.request import DEFAULT_LIMITS
    from portcullis.engine.clients import client_of
    from portcullis.engine.errors import GatewayError

    name = ROUTE_NAMES[args.protocol]
    headers = {}
    for header in args.header:
        key, colon, value = header.partition(":")
        if not colon or not key.strip():
            raise Failure(f"--header {header!r}: write it NAME:VALUE")
        headers[key.strip().lower()] = value.strip()
    path: dict[str, str] = {}
    if name in PATH_ACTIONS:
        if not args.model:
            raise Failure(f"--protocol {args.protocol} reads the model from the path: give --model")
        path = {"model": args.model, "action": PATH_ACTIONS[name][1 if args.stream else 0]}
    elif args.model or args.stream:
        raise Failure(f"--model and --stream are for converse and invoke; a {args.protocol} body names its model and stream itself")
    try:
        raw = args.request.read_bytes()
    except OSError as error:
        raise Failure(f"--request {args.request}: {error.strerror}") from None
    limits = config.request_limits if config is not None else DEFAULT_LIMITS
    if config is not None and len(raw) > config.max_request_bytes:
        raise Failure(f"the request is refused (body_too_large): the body exceeds the limit of {config.max_request_bytes} bytes")
    try:
        request = protocol(name).parser(Operation.INFERENCE)(raw, headers, "", limits, path)
    except GatewayError as error:
        raise Failure(f"the request is refused ({error.error_code}): {error.message}") from None
    request.session = session_of(headers)
    request.client = client_of(headers.get("user-agent"))
    return request


def _from_input(args: argparse.Namespace, bundle: Any, facts: dict[str, Any] | None) -> dict[str, Any]:
    from portcullis.engine.rego import PolicyError

    document = _json_file(args.input, "--input")
    if not (isinstance(document, dict) and isinstance(document.get("principal"), dict) and isinstance(document.get("request"), dict)):
        raise Failure(f"--input {args.input}: an input document is a JSON object with a principal and a request object")
    if facts is not None:
        document = {**document, "facts": facts} if facts else {key: value for key, value in document.items() if key != "facts"}
    try:
        plan = bundle.decide(document)
    except PolicyError as error:
        raise Failure(f"the policy could not decide: {error}") from None
    return _report(bundle, document, plan, None)


def _report(bundle: Any, document: dict[str, Any], plan: Any, fit: Any) -> dict[str, Any]:
    from portcullis.engine.activation import DECISION_RULE
    from portcullis.engine.explain import explain
    from portcullis.engine.rego import PolicyError

    try:
        source = bundle.policy.evaluate(DECISION_RULE, document)  # the plan as the rule wrote it (limits as written)
        verdicts = fit(source.get("targets") or []) if fit is not None and plan.allow else None
        explanation = explain(bundle.policy, bundle.bundle.data.get("portcullis") or {}, document, source, verdicts)
    except PolicyError as error:
        raise Failure(f"the policy could not explain the decision: {error}") from None
    refusal = None if plan.allow else plan.refusal(dt.datetime.now(dt.UTC))
    decision = {
        "allow": plan.allow,
        "code": plan.reasons[0].get("code"),
        "message": plan.reasons[0].get("message"),
        "requested_model": plan.requested_model,
        "model": plan.model,
        "refusal": {"status": refusal.kind.value, "code": refusal.error_code, "message": refusal.message} if refusal is not None else None,
        "plan": plan.audit_view(),
    }
    return {"bundle": {"revision": bundle.revision, "digest": bundle.digest}, "input": document, "decision": decision, "explanation": explanation}


def _fit(bundle: Any, config: Any, request: Any, targets: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Routing layer L5 on the plan's targets, as the gateway's governance step judges
    it (``adapters/context_fit.judge``): each target's input counted the way its
    provider counts (exact for a provider that speaks an OpenAI protocol, else an upper
    bound, estimated again only when that refuses). Without a configuration the
    providers' protocols are not known: every target is sized by its upper bound."""
    from portcullis.adapters.context_fit import judge
    from portcullis.adapters.protocols.registry import protocol
    from portcullis.adapters.providers import protocol_of
    from portcullis.engine.context_fit import EXACT, UPPER_BOUND, Sized
    from portcullis.engine.plan import Target
    from portcullis.engine.tokens import count_input_tokens

    counts: dict[bool, int] = {}

    def tokens(exact: bool) -> int:
        if exact not in counts:
            counts[exact] = count_input_tokens(request.body, exact)[0]
        return counts[exact]

    sized = []
    for entry in targets:
        target = Target.from_plan(entry)
        provider = config.providers.get(target.provider) if config is not None else None
        exact = provider is not None and protocol(protocol_of(provider) or request.protocol).wire.TOKEN_COUNT_EXACT
        sized.append(Sized(target, tokens(exact), EXACT if exact else UPPER_BOUND))

    async def estimate() -> int:
        return tokens(True)

    verdicts = asyncio.run(judge(bundle, request, sized, estimate))
    return [{**verdict.rejected(), "fits": verdict.fits, "screened": verdict.screened, "context_window": verdict.target.context_window} for verdict in verdicts]
