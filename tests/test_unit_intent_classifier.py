"""The intent classifier's answer becomes a guess only when it names one of the router's
tiers with a confidence from 0 to 1; anything else is a named failure, and the policy
then leaves the tier to the rules."""

from __future__ import annotations

import pytest

from portcullis.adapters.intent.classifier import ClassifierFailed, _guess

TIERS = ["frontier", "light", "standard"]


@pytest.mark.parametrize(
    ("answer", "guess"),
    [
        ('{"tier": "light", "confidence": 0.9}', {"tier": "light", "confidence": 0.9}),
        ('Sure! {"tier": "frontier", "confidence": 1} Hope that helps.', {"tier": "frontier", "confidence": 1.0}),
        ('{"tier": "standard", "confidence": 0.123456}', {"tier": "standard", "confidence": 0.12}),  # coarse: decisions cache
        ('{"tier": "light", "confidence": 0}', {"tier": "light", "confidence": 0.0}),
    ],
)
def test_a_tier_of_the_router_with_a_confidence_is_a_guess(answer: str, guess: dict) -> None:
    assert _guess(answer, TIERS) == guess


@pytest.mark.parametrize(
    ("answer", "code"),
    [
        ("light", "classifier_answer_unreadable"),
        ('{"tier": "light", "confidence": 0.9', "classifier_answer_unreadable"),
        ('["light", 0.9]', "classifier_answer_unreadable"),
        ('{"tier": "premium", "confidence": 0.9}', "classifier_unknown_tier"),
        ('{"tier": "light"}', "classifier_bad_confidence"),
        ('{"tier": "light", "confidence": 1.5}', "classifier_bad_confidence"),
        ('{"tier": "light", "confidence": -0.1}', "classifier_bad_confidence"),
        ('{"tier": "light", "confidence": true}', "classifier_bad_confidence"),
        ('{"tier": "light", "confidence": "high"}', "classifier_bad_confidence"),
        ('{"tier": "light", "confidence": NaN}', "classifier_bad_confidence"),
    ],
)
def test_anything_else_is_a_named_failure(answer: str, code: str) -> None:
    with pytest.raises(ClassifierFailed) as failed:
        _guess(answer, TIERS)
    assert str(failed.value) == code
