"""The files of one audit chain. The log is written to ``audit.path``; when it rotates,
that file is renamed beside it to ``<stem>.<first seq>-<last seq><suffix>``
(``audit.000000000001-000000052113.jsonl``) and a new one continues the chain: its
first record follows the renamed file's last. Names sort in chain order, and say which
records each holds without reading it, so files shipped away or deleted are visible as
a gap in the names (and, to ``audit verify``, in the seqs).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

SEQ_DIGITS = 12


def segment_path(active: Path, first_seq: int, last_seq: int) -> Path:
    return active.with_name(f"{active.stem}.{first_seq:0{SEQ_DIGITS}d}-{last_seq:0{SEQ_DIGITS}d}{active.suffix}")


def segments(active: Path) -> list[Path]:
    """The rotated files of the chain whose live file is ``active``, oldest first."""
    pattern = re.compile(rf"{re.escape(active.stem)}\.(\d{{{SEQ_DIGITS}}})-(\d{{{SEQ_DIGITS}}}){re.escape(active.suffix)}")
    found = []
    for path in active.parent.glob(f"{active.stem}.*{active.suffix}"):
        match = pattern.fullmatch(path.name)
        if match:
            found.append((int(match[1]), path))
    return [path for _, path in sorted(found)]


def chain_files(active: Path) -> list[Path]:
    """Every file of the chain in order: the rotated ones, then the live one (if present)."""
    return [*segments(active), *([active] if active.exists() else [])]


def sync_directory(directory: Path, what: str) -> None:
    """Force ``directory`` to the disk: a file created or renamed in it is durable once it
    is. A refusal is logged (``what`` names the directory's role) and not raised: the file
    itself was written; only its name may not survive a power cut."""
    try:
        descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
    except OSError as error:
        logging.getLogger("portcullis").warning("%s directory %s could not be forced to the disk (%s)", what, directory, error.strerror)
