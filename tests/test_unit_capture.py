"""Body capture for investigations (``adapters/capture.py``): real files under tmp_path,
real AES-GCM. What is on disk says nothing but the id; a wrong key, an altered byte or a
forged id does not open; quota and size skip captures without touching the request or
the evidence already kept; the configuration refuses a missing or reused key by name,
never by value; ``portcullis capture show`` and ``purge`` as an investigator runs them."""

from __future__ import annotations

import base64
import json
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from portcullis.adapters import cli
from portcullis.adapters.capture import BodyCapture, CaptureConfig, CaptureConfigError, CaptureError, open_capture, purge_expired
from portcullis.adapters.config import ConfigError, load_config

KEY, OTHER_KEY, VAULT_KEY = b"k" * 32, b"o" * 32, b"v" * 32
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
BODY = json.dumps({"model": "sonnet", "messages": [{"role": "user", "content": "my card is <CREDIT_CARD> and the secret word is tangerine"}]}).encode()
REQUEST_ID = "req_0123456789abcdef"


def b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


def capture(tmp_path: Path, key: bytes = KEY, **settings: object) -> BodyCapture:
    return BodyCapture(CaptureConfig(enabled=True, directory=tmp_path / "captures", key_env="CAPTURE_KEY", **settings), key)  # type: ignore[arg-type]


def files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "captures").iterdir())


def test_round_trip(tmp_path: Path) -> None:
    store = capture(tmp_path)
    capture_id = store.store(REQUEST_ID, "payments", BODY, "application/json", NOW)
    assert capture_id is not None
    opened = store.read(capture_id, now=NOW + timedelta(hours=1))
    assert (opened.capture_id, opened.request_id, opened.team, opened.content_type, opened.created, opened.body) == (
        capture_id,
        REQUEST_ID,
        "payments",
        "application/json",
        NOW,
        BODY,
    )
    assert "tangerine" not in repr(opened)
    assert store.stats.stored == 1 and store.stats.bytes_on_disk == files(tmp_path)[0].stat().st_size


def test_ids_are_random_and_not_derived_from_the_request(tmp_path: Path) -> None:
    store = capture(tmp_path)
    first, second = (store.store(REQUEST_ID, "payments", BODY, "application/json", NOW) for _ in range(2))
    assert first and second and first != second
    assert len(first) == 32 and int(first, 16) >= 0
    assert REQUEST_ID not in first and "0123456789abcdef" not in first


def test_nothing_readable_on_disk_but_the_id(tmp_path: Path) -> None:
    store = capture(tmp_path)
    capture_id = store.store(REQUEST_ID, "payments", BODY, "application/json", NOW)
    [path] = files(tmp_path)
    assert path.name == f"{capture_id}.cap"
    data = path.read_bytes()
    for readable in (b"tangerine", b"<CREDIT_CARD>", b"sonnet", REQUEST_ID.encode(), b"payments", b"application/json", b"2025-06-01"):
        assert readable not in data
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "captures").stat().st_mode) == 0o700


def test_another_key_does_not_open(tmp_path: Path) -> None:
    capture_id = capture(tmp_path).store(REQUEST_ID, "payments", BODY, "application/json", NOW)
    assert capture_id is not None
    with pytest.raises(CaptureError, match="does not open with this key"):
        capture(tmp_path, OTHER_KEY).read(capture_id, now=NOW)


@pytest.mark.parametrize("offset", [0, 5, 20, -1])  # version, nonce, ciphertext, tag
def test_an_altered_byte_does_not_open(tmp_path: Path, offset: int) -> None:
    store = capture(tmp_path)
    capture_id = store.store(REQUEST_ID, "payments", BODY, "application/json", NOW)
    [path] = files(tmp_path)
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CaptureError, match="does not open"):
        store.read(capture_id, now=NOW)  # type: ignore[arg-type]


def test_a_capture_renamed_to_another_id_does_not_open(tmp_path: Path) -> None:
    store = capture(tmp_path)
    capture_id = store.store(REQUEST_ID, "payments", BODY, "application/json", NOW)
    forged = "f" * 32
    os.rename(tmp_path / "captures" / f"{capture_id}.cap", tmp_path / "captures" / f"{forged}.cap")
    with pytest.raises(CaptureError, match="does not open"):
        store.read(forged, now=NOW)


@pytest.mark.parametrize("capture_id", ["../x", "a/b", "../" + "a" * 32, "A" * 32, "a" * 31, "a" * 32 + ".cap", ""])
def test_malformed_ids_are_refused_before_any_file_is_read(tmp_path: Path, capture_id: str) -> None:
    (tmp_path / "x.cap").write_bytes(b"outside the directory")
    with pytest.raises(CaptureError, match="is not a capture id"):
        capture(tmp_path).read(capture_id, now=NOW)


def test_a_missing_capture_is_named(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match=f"capture {'a' * 32} does not exist"):
        capture(tmp_path).read("a" * 32, now=NOW)


def test_a_body_too_large_is_skipped_and_counted(tmp_path: Path) -> None:
    store = capture(tmp_path, max_body_bytes=len(BODY) - 1)
    assert store.store(REQUEST_ID, "payments", BODY, "application/json", NOW) is None
    assert store.stats.skipped_too_large == 1 and store.stats.stored == 0 and files(tmp_path) == []
    assert store.store(REQUEST_ID, "payments", BODY[: len(BODY) - 1], "application/json", NOW) is not None


def test_a_full_quota_skips_new_captures_and_keeps_old_ones(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    one = capture(tmp_path).store(REQUEST_ID, "payments", BODY, "application/json", NOW)
    size = files(tmp_path)[0].stat().st_size
    store = capture(tmp_path, max_body_bytes=len(BODY), quota_bytes=2 * size)  # a restart: it scans what is there
    assert store.stats.bytes_on_disk == size
    two = store.store(REQUEST_ID, "payments", BODY, "application/json", NOW)
    assert two is not None
    assert store.store(REQUEST_ID, "payments", BODY, "application/json", NOW) is None
    assert store.store(REQUEST_ID, "payments", BODY, "application/json", NOW) is None
    assert store.stats.skipped_quota == 2 and store.stats.bytes_on_disk == 2 * size
    assert [path.stem for path in files(tmp_path)] == sorted([one, two])  # type: ignore[type-var]
    assert store.read(one, now=NOW).body == BODY  # type: ignore[arg-type]
    warnings = [r for r in caplog.records if "quota full" in r.getMessage()]
    assert len(warnings) == 1  # at most once a minute
    assert "tangerine" not in caplog.text and REQUEST_ID not in caplog.text


def test_room_freed_by_another_process_is_found_by_the_recount(tmp_path: Path) -> None:
    store = capture(tmp_path, max_body_bytes=len(BODY), quota_bytes=len(BODY) + 200, retention_seconds=3_600)
    assert store.store(REQUEST_ID, "payments", BODY, "application/json", NOW - timedelta(hours=2)) is not None
    assert store.store(REQUEST_ID, "payments", BODY, "application/json", NOW) is None  # full
    assert purge_expired(tmp_path / "captures", 3_600, NOW) == (1, 0)  # `portcullis capture purge`, elsewhere
    assert store.store(REQUEST_ID, "payments", BODY, "application/json", NOW) is None  # not seen yet
    assert store.recount() == 0
    assert store.store(REQUEST_ID, "payments", BODY, "application/json", NOW) is not None


def test_only_the_selected_teams_are_captured(tmp_path: Path) -> None:
    store = capture(tmp_path, teams=("payments",))
    assert store.store(REQUEST_ID, "research", BODY, "application/json", NOW) is None
    assert store.store(REQUEST_ID, "payments", BODY, "application/json", NOW) is not None
    assert len(files(tmp_path)) == 1 and store.stats.stored == 1


def test_nothing_is_captured_while_off(tmp_path: Path) -> None:
    store = BodyCapture(CaptureConfig(directory=tmp_path / "captures"), KEY)
    assert store.store(REQUEST_ID, "payments", BODY, "application/json", NOW) is None
    assert not (tmp_path / "captures").exists()
    assert open_capture(CaptureConfig(directory=tmp_path / "captures")) is None


def test_a_disk_error_is_counted_never_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = capture(tmp_path)
    (tmp_path / "captures").rmdir()
    (tmp_path / "captures").write_text("a file where the directory was")
    assert store.store(REQUEST_ID, "payments", BODY, "application/json", NOW) is None
    assert store.stats.failed == 1 and store.stats.stored == 0 and store.stats.bytes_on_disk == 0
    assert "not stored" in caplog.text and "tangerine" not in caplog.text


def test_purge_deletes_what_retention_has_passed_and_read_refuses_it(tmp_path: Path) -> None:
    store = capture(tmp_path, retention_seconds=86_400)
    old = store.store(REQUEST_ID, "payments", BODY, "application/json", NOW - timedelta(days=2))
    new = store.store(REQUEST_ID, "payments", BODY, "application/json", NOW)
    assert old and new
    with pytest.raises(CaptureError, match="expired"):
        store.read(old, now=NOW)
    before = store.stats.bytes_on_disk
    assert store.purge(NOW) == 1
    assert [path.stem for path in files(tmp_path)] == [new]
    assert store.stats.bytes_on_disk == before // 2
    assert store.read(new, now=NOW).body == BODY
    assert store.purge(NOW) == 0


# --- configuration ---------------------------------------------------------------------------


def write_config(tmp_path: Path, capture_section: dict | None = None, **extra: object) -> Path:
    document: dict = {"policy": {"bundle": "bundle"}, "providers": [{"name": "mock", "type": "mock"}], **extra}
    if capture_section is not None:
        document["capture"] = capture_section
    path = tmp_path / "portcullis.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_off_by_default(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path))
    assert config.capture.enabled is False and config.capture.directory == tmp_path / ".portcullis" / "captures"


def test_the_documented_section_is_accepted(tmp_path: Path) -> None:
    section = {
        "enabled": True,
        "directory": "evidence",
        "key_env": "CAPTURE_KEY",
        "max_body_bytes": 65_536,
        "quota_bytes": 10_000_000,
        "retention_seconds": 3_600,
        "teams": ["payments", "research"],
    }
    assert load_config(write_config(tmp_path, section)).capture == CaptureConfig(
        enabled=True,
        directory=tmp_path / "evidence",
        key_env="CAPTURE_KEY",
        max_body_bytes=65_536,
        quota_bytes=10_000_000,
        retention_seconds=3_600,
        teams=("payments", "research"),
    )


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"enabled": True, "colour": "red"}, "'colour' was unexpected"),
        ({"retention_seconds": 1}, "capture.retention_seconds"),
        ({"teams": ["../etc"]}, r"capture.teams\[0\]"),
        ({"key_env": "not a name"}, "capture.key_env"),
        ({"enabled": True}, "capture.key_env: required when capture.enabled is true"),
        ({"enabled": True, "key_env": "CAPTURE_KEY", "max_body_bytes": 2048, "quota_bytes": 1024}, "capture.quota_bytes"),
    ],
)
def test_invalid_sections_name_the_field(tmp_path: Path, section: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write_config(tmp_path, section))


def test_the_vault_variable_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"capture.key_env: names the PII vault's variable \(pii.vault.key_env\)"):
        load_config(write_config(tmp_path, {"enabled": True, "key_env": "SHARED_KEY"}, pii={"vault": {"key_env": "SHARED_KEY"}}))


def key_error(monkeypatch: pytest.MonkeyPatch, value: str | None, vault: str | bytes | None = None) -> str:
    if value is None:
        monkeypatch.delenv("CAPTURE_KEY", raising=False)
    else:
        monkeypatch.setenv("CAPTURE_KEY", value)
    with pytest.raises(CaptureConfigError) as raised:
        CaptureConfig(enabled=True, key_env="CAPTURE_KEY").key(vault)
    message = str(raised.value)
    assert message.startswith("capture.key_env: ")
    if value:
        assert value not in message and value.strip() not in message
    return message


def test_an_unset_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "environment variable CAPTURE_KEY is not set" in key_error(monkeypatch, None)
    assert "environment variable CAPTURE_KEY is not set" in key_error(monkeypatch, "")


@pytest.mark.parametrize("value", [b64(b"short"), b64(KEY)[:-4], "not base64 at all!", "ab" * 31])
def test_a_malformed_key_is_named_not_shown(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    assert "must hold a 32-byte key" in key_error(monkeypatch, value)


@pytest.mark.parametrize("vault", [b64(VAULT_KEY), VAULT_KEY.hex(), VAULT_KEY])  # however the vault's is written
def test_the_vault_key_is_refused_not_shown(monkeypatch: pytest.MonkeyPatch, vault: str | bytes) -> None:
    assert "holds the PII vault's key" in key_error(monkeypatch, b64(VAULT_KEY), vault)


def test_a_key_of_its_own_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CAPTURE_KEY", b64(KEY))
    config = CaptureConfig(enabled=True, directory=tmp_path / "captures", key_env="CAPTURE_KEY")
    assert config.key(b64(VAULT_KEY)) == KEY
    opened = open_capture(config, b64(VAULT_KEY))
    assert opened is not None and (tmp_path / "captures").is_dir()


def test_a_directory_that_cannot_be_made_stops_start_up(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(CaptureConfigError, match=r"capture\.directory: cannot create"):
        BodyCapture(CaptureConfig(enabled=True, directory=tmp_path / "file" / "captures", key_env="CAPTURE_KEY"), KEY)


# --- the command line -------------------------------------------------------------------------


def cli_config(tmp_path: Path, retention_seconds: int = 604_800) -> Path:
    section = {"enabled": True, "directory": "captures", "key_env": "CAPTURE_KEY", "retention_seconds": retention_seconds}
    return write_config(tmp_path, section, pii={"vault": {"key_env": "VAULT_KEY"}})


def test_show_prints_the_body_to_stdout_and_its_metadata_to_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    monkeypatch.setenv("CAPTURE_KEY", b64(KEY))
    capture_id = capture(tmp_path).store(REQUEST_ID, "payments", BODY, "application/json", datetime.now(UTC))
    assert capture_id is not None
    assert cli.main(["capture", "show", capture_id, "--config", str(cli_config(tmp_path))]) == 0
    out, err = capsysbinary.readouterr()
    assert out == BODY
    assert f"capture {capture_id}: request {REQUEST_ID}, team payments, application/json".encode() in err and b"tangerine" not in err


def test_show_refuses_an_unknown_id_a_wrong_key_and_the_vault_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    config = str(cli_config(tmp_path))
    capture_id = capture(tmp_path).store(REQUEST_ID, "payments", BODY, "application/json", datetime.now(UTC))
    assert capture_id is not None
    monkeypatch.setenv("CAPTURE_KEY", b64(KEY))
    assert cli.main(["capture", "show", "b" * 32, "--config", config]) == 1
    assert cli.main(["capture", "show", "../portcullis.yaml", "--config", config]) == 1
    monkeypatch.setenv("CAPTURE_KEY", b64(OTHER_KEY))
    assert cli.main(["capture", "show", capture_id, "--config", config]) == 1
    monkeypatch.setenv("CAPTURE_KEY", b64(VAULT_KEY))
    monkeypatch.setenv("VAULT_KEY", VAULT_KEY.hex())
    assert cli.main(["capture", "show", capture_id, "--config", config]) == 2
    out, err = capsysbinary.readouterr()
    assert out == b""
    assert b"does not exist" in err and b"is not a capture id" in err and b"does not open with this key" in err and b"holds the PII vault's key" in err
    assert b64(VAULT_KEY).encode() not in err and b"tangerine" not in err


def test_purge_deletes_the_expired_captures_without_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    monkeypatch.delenv("CAPTURE_KEY", raising=False)
    store = capture(tmp_path)
    now = datetime.now(UTC)
    old = store.store(REQUEST_ID, "payments", BODY, "application/json", now - timedelta(hours=2))
    kept = store.store(REQUEST_ID, "payments", BODY, "application/json", now)
    assert old and kept
    assert cli.main(["capture", "purge", "--config", str(cli_config(tmp_path, retention_seconds=3_600))]) == 0
    out, _ = capsysbinary.readouterr()
    assert b": 1 expired capture(s) deleted" in out
    assert [path.stem for path in files(tmp_path)] == [kept]
