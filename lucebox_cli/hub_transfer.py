"""Moving one file's bytes for hub.py: the resumable HTTP download loop, the disk-space check, the
size and hash verification against the hub's listing, and the snapshot link. huggingface_hub stays
hub.py's: what the loop needs from it (session, status check, error types) comes in a HubTransport."""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lucebox_cli.errors import DownloadError

if TYPE_CHECKING:
    from lucebox_cli.hub import PlannedFile, ProgressFn

HASH_BLOCK = 8 << 20
# Attempts in a row that bring no new bytes before giving up on a file.
MAX_STALLED_ATTEMPTS = 4
# Transient answers worth retrying mid-download (rate limits, CDN hiccups); others fail at once.
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
# hub.py's logger: these lines are part of a pull's log
_log = logging.getLogger("lucebox_cli.hub")


@dataclass(frozen=True)
class HubTransport:
    """The huggingface_hub (and httpx) pieces the download loop uses, handed in by hub.py."""

    session: Callable[[], Any]  # an HTTP client with .stream(method, url, headers=, timeout=)
    raise_for_status: Callable[[Any], None]
    http_error: type[Exception]  # raised by raise_for_status; carries .response
    transport_error: type[Exception]  # connection cuts and timeouts
    map_error: Callable[[Exception, str], Exception]  # to a one-line LuceboxError
    timeout: Callable[[], float]


def file_hash(path: Path, file: PlannedFile) -> tuple[str, str]:
    """(kind, hex digest) comparable with the hub's: sha256 for LFS files, git blob sha1 otherwise."""
    if file.sha256:
        h = hashlib.sha256()
    else:
        h = hashlib.sha1()
        h.update(b"blob %d\0" % path.stat().st_size)
    with path.open("rb") as f:
        while block := f.read(HASH_BLOCK):
            h.update(block)
    return ("sha256" if file.sha256 else "git-sha1"), h.hexdigest()


def verify(path: Path, file: PlannedFile) -> None:
    """Raise DownloadError (and delete the partial blob) unless size and hash match the hub's."""
    size = path.stat().st_size
    if size != file.size:
        path.unlink(missing_ok=True)
        raise DownloadError(
            f"{file.repo_id}/{file.path}: got {size} bytes, the hub advertised {file.size}",
            hint="rerun `lucebox pull`; the partial file was removed",
        )
    expected = file.sha256 or file.blob_id
    if not expected or (not file.sha256 and not re.fullmatch(r"[0-9a-f]{40}", expected)):
        return
    kind, digest = file_hash(path, file)
    if digest != expected:
        path.unlink(missing_ok=True)
        raise DownloadError(
            f"checksum mismatch for {file.repo_id}/{file.path}: {kind} {digest[:12]}… != hub {expected[:12]}…",
            hint="the corrupt download was removed; rerun `lucebox pull` (check proxies or HF_ENDPOINT mirrors)",
        )


def get_once(
    url: str, dest: Path, have: int, size: int, headers: dict[str, str], on_bytes: Callable[[int], None],
    hf: HubTransport,
) -> None:
    """One GET appending to `dest` from byte `have` (Range when > 0); partial data stays on disk."""
    req = dict(headers)
    if have:
        req["Range"] = f"bytes={have}-"
    with hf.session().stream("GET", url, headers=req, timeout=hf.timeout()) as resp:
        if have and resp.status_code == 416:
            # Our partial file is not a prefix the server recognises: start over.
            dest.unlink(missing_ok=True)
            return
        hf.raise_for_status(resp)
        if have and resp.status_code == 206:
            content_range = resp.headers.get("Content-Range", "")
            if not content_range.startswith(f"bytes {have}-"):
                dest.unlink(missing_ok=True)
                raise DownloadError(f"server answered Range bytes={have}- with {content_range!r}", hint="rerun")
            mode = "ab"
        else:
            # A 200 to a Range request is the whole file: drop what we had.
            mode, have = "wb", 0
        with dest.open(mode) as out:
            for chunk in resp.iter_bytes():
                out.write(chunk)
                have += len(chunk)
                if have > size:
                    break
                on_bytes(have)
    if have > size:
        dest.unlink(missing_ok=True)
        raise DownloadError(f"{url}: the server sent more than the advertised {size} bytes", hint="rerun later")


def size_on_disk(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def stream_to(url: str, dest: Path, file: PlannedFile, headers: dict[str, str], progress: ProgressFn | None,
              hf: HubTransport) -> None:
    """Bring `dest` to file.size bytes, resuming after cuts; gives up after repeated attempts with no progress."""
    what = f"{file.repo_id}/{file.path}"
    stalled = 0
    while True:
        have = size_on_disk(dest)
        if progress:
            progress(file, have)
        if have == file.size and dest.exists():
            return
        if have:
            _log.info("resuming %s at byte %d of %d", what, have, file.size)
        try:
            get_once(url, dest, have, file.size, headers, lambda n: progress(file, n) if progress else None, hf)
            failure: Exception | None = None
        except hf.http_error as err:
            status = err.response.status_code if err.response is not None else None
            if status not in RETRY_STATUS:
                raise hf.map_error(err, what) from err
            failure = err
        except hf.transport_error as err:
            failure = err
        # A cut after new bytes retries at once; attempts that bring nothing back off, then give up.
        stalled = 0 if size_on_disk(dest) > have else stalled + 1
        if stalled >= MAX_STALLED_ATTEMPTS:
            if failure is not None:
                raise hf.map_error(failure, what) from failure
            raise DownloadError(f"{what}: the server keeps sending no data", hint="rerun later; downloads resume")
        if failure is not None:
            _log.warning("transfer of %s interrupted (%s); retrying", what, type(failure).__name__)
            time.sleep(0.5 * stalled * stalled)


def check_space(folder: Path, needed: int, what: str) -> None:
    free = shutil.disk_usage(folder).free
    if needed > free:
        raise DownloadError(
            f"not enough disk space for {what}: {needed / 1e9:.1f} GB needed, {free / 1e9:.1f} GB free in {folder}",
            hint="free some space, or point HF_HUB_CACHE (or HF_HOME) at a bigger disk",
        )


def link(blob: Path, pointer: Path) -> None:
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if pointer.is_symlink() or pointer.exists():
        pointer.unlink()
    try:
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    except OSError:
        # Filesystems without symlinks get a copy, as huggingface_hub does.
        shutil.copy2(blob, pointer)
