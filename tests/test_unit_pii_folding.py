"""The detectors' shared folding (``engine.textfold``), the labels that find unformatted
identifiers (``engine.pii.context``), and JSON numbers on the way to the recognisers."""

from __future__ import annotations

import json
import random
import sys
import unicodedata
from typing import Any

import pytest

from bench.pii_accuracy import FOLDING, load, patterns, score
from portcullis.adapters.protocols.text import read_strings, visit_json_text, visit_leaves
from portcullis.engine import textfold
from portcullis.engine.integrity import scanner
from portcullis.engine.pii.context import MemberValue, member_entities
from portcullis.engine.pii.recognizers import ENTITY_ORDER, find, find_all, with_repeats
from portcullis.engine.pii.redaction import mask, rewrite
from portcullis.engine.pii.validators import kr_rrn_labelled


def found(text: str, member: str | None = None) -> list[tuple[str, str]]:
    return [(f.entity, text[f.start : f.end]) for f in find(text, member=member)]


# --- folding --------------------------------------------------------------------------------


def test_every_unicode_space_separator_folds_to_a_space() -> None:
    separators = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) in ("Zs", "Zl", "Zp") and c != 0x20]
    assert len(separators) >= 18
    assert textfold.fold("".join(separators)) == " " * len(separators)
    assert textfold.fold("\x0b\x85") == "  "


def test_full_width_forms_and_dashes_fold_to_ascii_character_for_character() -> None:
    full_width = "".join(chr(c) for c in range(0xFF01, 0xFF5F))
    assert textfold.fold(full_width) == "".join(chr(c) for c in range(0x21, 0x7F))
    assert textfold.fold("412\u201155\u20107391 \u2013 \u2014 \u2212 \ufe63") == "412-55-7391 - - - -"
    assert textfold.fold("a\ud800b") == "a\ufffdb"  # what RE2 can read, one for one
    assert textfold.fold("\u017ftop the \u212aelvin") == "stop the Kelvin"  # RE2's case folding reads them so
    text = "plain ASCII, untouched"
    assert textfold.fold(text) is text
    assert textfold.fold("한국어 本文") == "한국어 本文"


def test_percent_escaped_email_characters_decode_and_map_back_to_the_original() -> None:
    text = "u=jane.doe%2Bnews%40example.com&x=100%25&y=%40"
    folded = textfold.fold_mapped(text)
    assert folded.text == "u=jane.doe+news@example.com&x=100%25&y=@"
    start = folded.text.index("jane")
    end = folded.text.index(".com") + 4
    assert text[slice(*folded.span(start, end))] == "jane.doe%2Bnews%40example.com"
    assert folded.span(0, len(folded.text)) == (0, len(text))


def test_the_offset_map_holds_for_any_mix_of_escapes_and_text() -> None:
    rng = random.Random(7)
    pieces = ["a", "é", "\u00a0", "%40", "%2e", "%41", "%", "４", "@", "-"]
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        folded = textfold.fold_mapped(text)
        for start in range(len(folded.text) + 1):
            for end in range(start, len(folded.text) + 1):
                original = text[slice(*folded.span(start, end))]
                assert textfold.fold_mapped(original).text == folded.text[start:end]


def test_the_injection_scanner_reads_the_same_folding() -> None:
    texts = ["ignore\u00a0all\u2009previous", "ｉｇｎｏｒｅ　ｐｒｅｖｉｏｕｓ", "a\u2013b\x0bc", "ascii only", "lone \udc00"]
    for text in texts:
        assert scanner.normalise(text) == textfold.fold(text)
        assert scanner.normalised_utf8(text) == textfold.fold(text).encode()
    rules = scanner.Scanner([{"id": "override", "weight": 3, "pattern": r"(?i)ignore\s+(all\s+)?previous"}])
    assert [rules.scan(text).rules for text in texts[:2]] == [("override",), ("override",)]


# --- recognisers over folded text ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("card 4111\u00a01111\u00a01111\u00a01111", [("CREDIT_CARD", "4111\u00a01111\u00a01111\u00a01111")]),
        ("card 4111.1111.1111.1111 ok", [("CREDIT_CARD", "4111.1111.1111.1111")]),
        ("card 4111 1111.1111-1111", []),  # one separator throughout, or it is no printed card
        ("Konto DE89\u202f3704\u202f0044\u202f0532\u202f0130\u202f00.", [("IBAN", "DE89\u202f3704\u202f0044\u202f0532\u202f0130\u202f00")]),
        ("cuenta ES91-2100-0418-4502-0005-1332", [("IBAN", "ES91-2100-0418-4502-0005-1332")]),
        ("メール：ｔａｒｏ＠ｅｘａｍｐｌｅ．ｊｐ", [("EMAIL", "ｔａｒｏ＠ｅｘａｍｐｌｅ．ｊｐ")]),
        ("GET /u?e=jane.doe%40example.com HTTP/1.1", [("EMAIL", "jane.doe%40example.com")]),
        ("npm i %40types%2Fnode", []),
        ("SSN 412\u201155\u20117391", [("US_SSN", "412\u201155\u20117391")]),
        ("携帯　０９０－１２３４－５６７８", [("PHONE", "０９０－１２３４－５６７８")]),
        ("portable 06.12.34.56.78, fixe 01-45-67-89-10", [("PHONE", "06.12.34.56.78"), ("PHONE", "01-45-67-89-10")]),
        ("연락처 010.2345.6789 / Büro 089/4567890", [("PHONE", "010.2345.6789"), ("PHONE", "089/4567890")]),
        ("Facture du 14.03.2024, version 01.12.34.56.78, lot 06.12.34.56", []),
    ],
)
def test_separators_and_forms_a_reader_takes_for_the_same_identifier(text: str, expected: list[tuple[str, str]]) -> None:
    assert found(text) == expected


def test_a_transform_replaces_the_original_span_and_leaves_every_other_character() -> None:
    text = "→ 4111\u00a01111\u00a01111\u00a01111 | mailto:jane%40example.com | ｔａｒｏ＠ｅｘａｍｐｌｅ．ｊｐ　end\u2009."
    findings = find(text)
    placeholders = {("EMAIL", "jane%40example.com"): "<EMAIL_1>", ("EMAIL", "ｔａｒｏ＠ｅｘａｍｐｌｅ．ｊｐ"): "<EMAIL_2>"}
    result = rewrite(text, findings, {"CREDIT_CARD": "mask", "EMAIL": "pseudonymize"}, placeholders)
    assert result == "→ 4111\u00a0****\u00a0****\u00a01111 | mailto:<EMAIL_1> | <EMAIL_2>　end\u2009."


def test_a_masked_e_mail_keeps_its_domain_however_its_at_sign_was_written() -> None:
    assert mask("EMAIL", "jane%40example.com") == "j***%40example.com"
    assert mask("EMAIL", "ｔａｒｏ＠ｅｘａｍｐｌｅ．ｊｐ") == "ｔ***＠ｅｘａｍｐｌｅ．ｊｐ"
    assert mask("EMAIL", "ana@example.es") == "a**@example.es"


# --- labels ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("SSN: 412557391", [("US_SSN", "412557391")]),
        ("her social security number is 531 40 2286.", [("US_SSN", "531 40 2286")]),
        ('{"ssn": "412557391"}', [("US_SSN", "412557391")]),
        ("name,ssn,dob\nAna,604173358,1988-02-11\nBo,287610453,1990-07-30", [("US_SSN", "604173358"), ("US_SSN", "287610453")]),
        ("| id | SSN |\n|---|---|\n| 100234567 | 412557391 |", [("US_SSN", "412557391")]),
        ("주민등록번호는 2102113136158입니다", [("KR_RRN", "2102113136158")]),
        ("IBAN: de89370400440532013000", [("IBAN", "de89370400440532013000")]),
        ("IBAN DE89 37040044 0532013000 BIC COBADEFFXXX", [("IBAN", "DE89 37040044 0532013000")]),
        # look-alikes: no label, the label has its own value, a digit or a sentence break between
        ("ticket 412557391", []),
        ("ssn_verified=true user_id=100234567", []),
        ("SSN lookup v2 is down, ticket 884213307", []),
        ("SSN field left blank; case 884213307", []),
        ("Journal ISSN 0317-8471", []),
        ("주문번호 2102113136158", []),
        ("주민번호 830821-2078668", []),  # born before October 2020: its check digit must hold
        ("name,ssn\nAna,hash-a3f9\n,604173358 is the order", []),
    ],
)
def test_labels_find_unformatted_identifiers_and_only_those_they_name(text: str, expected: list[tuple[str, str]]) -> None:
    assert found(text) == expected


def test_a_json_members_name_is_a_label_for_its_whole_value() -> None:
    assert found("412557391", member="ssn") == [("US_SSN", "412557391")]
    assert found("412557391", member="customerSsn") == [("US_SSN", "412557391")]
    assert found("412557391", member="ticket") == []
    assert found("4.1.2.7", member="version") == [] and found("10.0.0.1", member="host") == [("IP_ADDRESS", "10.0.0.1")]
    assert member_entities("iban_country") == {"IBAN"} and member_entities("missing") == frozenset()


def test_a_labelled_value_is_found_where_the_request_repeats_it_unlabelled() -> None:
    texts = [MemberValue("412557391", "ssn"), "customer 412557391 called; order 4125573912 and x412557391 are others", "nothing"]
    results = with_repeats(texts, [find_all(text, member=getattr(text, "member", None)) for text in texts])
    assert [[(f.entity, text[f.start : f.end], f.start) for f in found] for text, found in zip(texts, results, strict=True)] == [
        [("US_SSN", "412557391", 0)],
        [("US_SSN", "412557391", 9)],
        [],
    ]
    assert with_repeats(["ticket 412557391", "412557391"], [[], []]) == [[], []]  # nothing labelled, nothing spread


def test_an_rrn_without_a_check_digit_is_one_only_when_born_since_october_2020() -> None:
    assert kr_rrn_labelled("2102113136158") and kr_rrn_labelled("201215-3123456")
    assert not kr_rrn_labelled("2009303123456")  # September 2020, wrong check digit
    assert kr_rrn_labelled("900101-5234569") and not kr_rrn_labelled("900101-5234563")  # a foreigner's, with its check digit
    assert not kr_rrn_labelled("901301-1234568")


# --- numbers on the way to the recognisers -----------------------------------------------------


def test_numbers_are_visited_as_their_decimal_text_and_a_replaced_one_becomes_a_string() -> None:
    document: dict[str, Any] = {"card": 4111111111111111, "n": 3, "ok": True, "price": 2.5, "nested": [{"ssn": "412557391"}]}
    seen: list[tuple[str, str | None]] = []

    def visit(surface: str, text: str) -> str:
        seen.append((text, getattr(text, "member", None)))
        return "4111********1111" if text == "4111111111111111" else text

    visit_leaves(document, "tool_arguments", visit)
    assert document == {"card": "4111********1111", "n": 3, "ok": True, "price": 2.5, "nested": [{"ssn": "412557391"}]}
    assert type(document["n"]) is int and type(document["nested"][0]["ssn"]) is str  # never the wrapper
    assert ("4111111111111111", "card") in seen and ("3", "n") in seen and ("2.5", "price") in seen and ("412557391", "ssn") in seen
    assert all(text not in ("True", "true") for text, _ in seen)  # booleans are not numbers


def test_numbers_where_no_filter_can_change_them_are_still_read() -> None:
    seen: list[str] = []
    read_strings({"seed": 4111111111111111, "flags": [True, 2.5], "name": "x"}, lambda _, text: seen.append(text) or text)
    assert seen == ["seed", "4111111111111111", "flags", "2.5", "name", "x"]


def test_json_text_keeps_every_number_as_written_unless_one_is_replaced() -> None:
    arguments = '{"a": 1.50, "b": 1e3, "card": 4111111111111111}'
    assert visit_json_text(arguments, "tool_arguments", lambda _, text: text) is arguments
    replaced = visit_json_text(arguments, "tool_arguments", lambda _, text: "<CREDIT_CARD_1>" if text.startswith("4111") else text)
    assert json.loads(replaced) == {"a": 1.5, "b": 1000.0, "card": "<CREDIT_CARD_1>"}
    assert '"a": 1.50' in replaced and '"b": 1e3' in replaced


def test_member_values_are_strings_that_remember_their_member() -> None:
    value = MemberValue("412557391", "ssn")
    assert value == "412557391" and value.member == "ssn" and json.dumps({"k": value}) == '{"k": "412557391"}'


# --- the held-out corpus written for these forms -----------------------------------------------


def test_the_folding_corpus_holds_its_measured_accuracy() -> None:
    """A regression floor on ``tests/pii_corpus_folding.jsonl`` (written before the
    folding and the labels existed; its second part after, untuned): measured 1.00
    precision for every type and 0.97 recall overall; ``python -m bench.pii_accuracy
    --all`` prints the figures."""
    tallies = score(load(FOLDING), patterns, ENTITY_ORDER)["entity"]
    true, false, missed = (sum(counter[e] for e in ENTITY_ORDER) for counter in (tallies.true, tallies.false, tallies.missed))
    assert true / (true + false) >= 0.97 and true / (true + missed) >= 0.93
    assert all(tallies.precision(e) >= 0.9 and tallies.recall(e) >= 0.85 for e in ENTITY_ORDER)
