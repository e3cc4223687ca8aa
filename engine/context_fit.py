"""Routing layer L5, context fit: which authorised targets can take a request as it
will be sent, decided by the bundle (``data.portcullis.context_fit_verdicts``).

The gateway counts; the policy decides. Each target's input is counted the way its
provider would be sized (see ``engine/tokens.py``) and named by method: ``exact``
(tiktoken, for OpenAI-compatible targets), ``upper_bound`` (one token per UTF-8 byte,
never below the real count) and ``estimate`` (tiktoken for a target whose own
tokenizer the gateway lacks). The bundle adds each method's declared margin and the
output the request may generate, and compares with the target's context window.

The cheap order: the first verdict uses the counts governance already made for the
reservation; only a target refused on its upper bound — which may still fit — is
counted again, as an estimate, and judged a second time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from portcullis.engine.errors import ErrorKind, GatewayError
from portcullis.engine.target import Target

EXACT, ESTIMATE, UPPER_BOUND = "exact", "estimate", "upper_bound"
CODE = "context_length_exceeded"  # OpenAI's code for it; every protocol's SDK reads it in its own envelope


@dataclass(frozen=True)
class Generation:
    """What the request may generate, as the client asked: its output cap, and its
    reasoning as a declared budget or a named effort (the bundle prices an effort)."""

    output_tokens: int | None
    reasoning_tokens: int | None = None
    reasoning_effort: str | None = None


@dataclass(frozen=True)
class Screen:
    """The shortcut a bundle allows (its index's ``context_fit.screen``): a target whose
    input, plus the largest margin and the largest output allowance, fits its window is
    admitted without evaluating the rule, on a request that declares no reasoning
    budget. Conservative by construction: whatever it admits, the rule would admit."""

    margin_percent: int
    output_tokens: int  # the allowance of a request without an output cap, reasoning included

    @classmethod
    def from_index(cls, index: Any) -> Screen | None:
        screen = index.get("screen") if isinstance(index, Mapping) else None
        if not isinstance(screen, Mapping):
            return None
        margin, output = screen.get("margin_percent"), screen.get("output_tokens")
        if not all(isinstance(value, int) and not isinstance(value, bool) and value >= 0 for value in (margin, output)):
            return None
        return cls(margin, output)

    def admits(self, sized: Sequence[Sized], generation: Generation) -> bool:
        if generation.reasoning_tokens is not None:
            return False
        cap = generation.output_tokens if generation.output_tokens is not None else self.output_tokens
        for item in sized:
            margin = -(-item.input_tokens * self.margin_percent // 100)
            if item.input_tokens + margin + min(cap, item.target.max_output_tokens) > item.target.context_window:
                return False
        return True


@dataclass(frozen=True)
class Sized:
    """One target with its input counted."""

    target: Target
    input_tokens: int
    method: str


@dataclass(frozen=True)
class Verdict:
    """The bundle's verdict on one target, with the numbers it compared."""

    target: Target
    fits: bool
    reasons: tuple[str, ...]
    input_tokens: int
    margin_tokens: int
    output_tokens: int
    reasoning_tokens: int
    method: str
    screened: bool = False  # admitted by the bundle's screen: the rule was not evaluated

    @property
    def needed(self) -> int:
        return self.input_tokens + self.margin_tokens + self.output_tokens

    def rejected(self) -> dict[str, Any]:
        """How the audit record lists a target this layer skipped."""
        return {
            **{key: value for key, value in self.target.describe().items() if key in ("provider", "model", "region", "regions")},
            "reasons": list(self.reasons),
            "input_tokens": self.input_tokens,
            "margin_tokens": self.margin_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "context_window": self.target.context_window,
            "max_output_tokens": self.target.max_output_tokens,
            "method": self.method,
        }


def fit_input(sized: Sequence[Sized], generation: Generation) -> dict[str, Any]:
    """The entry point's input document."""
    return {
        "targets": [
            {
                "index": index,
                "context_window": item.target.context_window,
                "max_output_tokens": item.target.max_output_tokens,
                "input_tokens": item.input_tokens,
                "method": item.method,
            }
            for index, item in enumerate(sized)
        ],
        "output_tokens": generation.output_tokens,
        "reasoning_tokens": generation.reasoning_tokens,
        "reasoning_effort": generation.reasoning_effort,
    }


def read_verdicts(sized: Sequence[Sized], document: Any) -> list[Verdict]:
    """The entry point's answer, one verdict per target, checked for shape: a policy
    that answers anything else fails closed (``ValueError``)."""
    if not isinstance(document, list) or len(document) != len(sized):
        raise ValueError("context_fit_verdicts did not return one verdict per target")
    verdicts = []
    for item, entry in zip(sized, document, strict=True):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("fits"), bool):
            raise ValueError("context_fit_verdicts returned a malformed verdict")
        verdicts.append(
            Verdict(
                target=item.target,
                fits=entry["fits"],
                reasons=tuple(str(reason) for reason in entry.get("reasons") or ()),
                input_tokens=int(entry["input_tokens"]),
                margin_tokens=int(entry["margin_tokens"]),
                output_tokens=int(entry["output_tokens"]),
                reasoning_tokens=int(entry["reasoning_tokens"]),
                method=str(entry["method"]),
            )
        )
    return verdicts


def refusal(verdicts: Sequence[Verdict]) -> GatewayError:
    """The 400 when no target fits, naming the sizes (counts, never content). The
    closest target is named: the one whose window is the largest."""
    closest = max(verdicts, key=lambda verdict: (verdict.target.context_window, -verdict.needed))
    if "context_exceeded" not in closest.reasons:  # only the reasoning budget is too large
        message = (
            f"the reasoning budget of {closest.reasoning_tokens} tokens is not below the model's maximum output of "
            f"{closest.target.max_output_tokens} tokens; lower the budget"
        )
        return GatewayError(ErrorKind.INVALID_REQUEST, message, code=CODE)
    margin = f", a {closest.margin_tokens}-token margin for an {closest.method} count included" if closest.margin_tokens else ""
    reasoning = ", reasoning included" if closest.reasoning_tokens else ""
    message = (
        f"this model's maximum context length is {closest.target.context_window} tokens; the request needs {closest.needed} "
        f"({closest.input_tokens + closest.margin_tokens} in the input{margin}; {closest.output_tokens} for the output{reasoning}): "
        "shorten the messages or lower the output limit"
    )
    return GatewayError(ErrorKind.INVALID_REQUEST, message, code=CODE)
