"""The only user of huggingface_hub: plan, download (resumable, SHA-256 checked) and find cached files.

Files land in the shared HF cache in huggingface_hub's own layout
(`models--org--repo/{blobs,snapshots/<commit>,refs}`), so other tools see them and we see theirs.

Environment is read at call time, never at import: HF_HOME / HF_HUB_CACHE (where), HF_ENDPOINT (which
hub), HF_TOKEN (auth), HF_HUB_OFFLINE (no network). huggingface_hub snapshots several of these into
constants when it is imported, so every call here passes cache dir, endpoint and token explicitly and
decides offline mode itself.

Downloads use plain HTTP (never xet) into `blobs/<etag>.incomplete`, which survives an interrupted run
and is continued with a Range request next time; a file is moved to its final blob name and linked into
the snapshot only after its size and hash match what the hub advertised.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lucebox_cli import __version__
from lucebox_cli.errors import DownloadError, ModelNotFound
from lucebox_cli.hub_transfer import HubTransport, check_space, link, size_on_disk, stream_to, verify
from lucebox_cli.registry import ModelSpec, RepoFiles

DEFAULT_ENDPOINT = "https://huggingface.co"
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})\.")


# ----------------------------------------------------------------------------- environment (call time)


def _is_true(value: str | None) -> bool:
    return (value or "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hf_home() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(os.path.expandvars(os.environ.get("HF_HOME") or str(default))).expanduser()


def cache_dir() -> Path:
    """The hub cache: HF_HUB_CACHE, else the legacy HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub."""
    value = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    return Path(os.path.expandvars(value)).expanduser() if value else hf_home() / "hub"


def env_offline() -> bool:
    return _is_true(os.environ.get("HF_HUB_OFFLINE")) or _is_true(os.environ.get("TRANSFORMERS_OFFLINE"))


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _token() -> str | bool:
    """HF_TOKEN, else the token file `hf auth login` wrote; False (send none) when there is neither."""
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if os.environ.get(var, "").strip():
            return os.environ[var].strip()
    path = Path(os.environ.get("HF_TOKEN_PATH") or hf_home() / "token").expanduser()
    try:
        token = path.read_text().strip()
    except OSError:
        return False
    return token or False


def _download_timeout() -> float:
    try:
        return float(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT") or 30)
    except ValueError:
        return 30.0


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class PlannedFile:
    """One file to fetch: `revision` is the resolved commit; `sha256` is set for LFS files."""

    repo_id: str
    path: str
    size: int
    sha256: str | None
    revision: str
    role: str
    blob_id: str | None = None
    cached: bool = False

    @property
    def etag(self) -> str | None:
        # The hub's ETag (and so the cache's blob name) is the sha256 for LFS files, the git blob id otherwise.
        return self.sha256 or self.blob_id


@dataclass(frozen=True)
class PulledFile:
    repo_id: str
    path: str
    size: int
    local_path: Path
    role: str
    sha256: str | None = None


@dataclass(frozen=True)
class RepoResult:
    repo_id: str
    revision: str
    commit: str | None
    roles: tuple[str, ...]
    snapshot: Path | None


@dataclass(frozen=True)
class PullResult:
    name: str
    repos: tuple[RepoResult, ...]
    files: tuple[PulledFile, ...]
    cache_dir: Path | None
    offline: bool

    def paths(self, role: str) -> list[Path]:
        return [f.local_path for f in self.files if f.role == role]

    def dir(self, role: str) -> Path | None:
        """The snapshot folder holding a role's files (e.g. the draft checkpoint directory)."""
        paths = self.paths(role)
        if not paths:
            return None
        repo = next((r for r in self.repos if role in r.roles), None)
        return repo.snapshot if repo and repo.snapshot else paths[0].parent

    def to_json(self) -> dict[str, Any]:
        """The `pull --json` object: repos (revision asked, commit got), files with local path and size."""
        target = next((r for r in self.repos if "target" in r.roles), None)
        return {
            "name": self.name,
            "offline": self.offline,
            "cache_dir": _str_or_none(self.cache_dir),
            "revision": target.commit if target else None,
            "repos": [{**asdict(r), "roles": list(r.roles), "snapshot": _str_or_none(r.snapshot)} for r in self.repos],
            "files": [{**asdict(f), "local_path": str(f.local_path)} for f in self.files],
            "total_size": sum(f.size for f in self.files),
        }


def _str_or_none(path: Path | None) -> str | None:
    return str(path) if path is not None else None


# Called with the file and the bytes of it on disk so far (resumed bytes count; equals size when done).
ProgressFn = Callable[[PlannedFile, int], None]


# ----------------------------------------------------------------------------- matching and cache layout


def _matches(path: str, patterns: Iterable[str]) -> bool:
    # huggingface_hub's allow_patterns semantics: fnmatch on the repo path, where `*` also crosses `/`.
    return any(fnmatch.fnmatchcase(path, p) for p in patterns)


def _groups(spec: ModelSpec) -> list[tuple[str, str, list[RepoFiles]]]:
    """Repos in spec order, merged by (repo, revision): the 0.8B target and tokenizer share one repo."""
    groups: dict[tuple[str, str], list[RepoFiles]] = {}
    for rf in spec.repos:
        groups.setdefault((rf.repo_id, rf.revision), []).append(rf)
    return [(repo, rev, rfs) for (repo, rev), rfs in groups.items()]


def _role_of(path: str, rfs: list[RepoFiles], include: list[str] | None) -> str | None:
    if include and not _matches(path, include):
        return None
    return next((rf.role for rf in rfs if _matches(path, rf.allow_patterns)), None)


def _storage(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def _cached_commit(storage: Path, revision: str) -> str | None:
    if _COMMIT_RE.match(revision):
        return revision
    try:
        return (storage / "refs" / revision).read_text().strip() or None
    except OSError:
        return None


def _pointer(storage: Path, commit: str, path: str) -> Path:
    return storage / "snapshots" / commit / Path(*path.split("/"))


def _not_cached(spec: ModelSpec, cache: Path, offline_reason: str | None, detail: str = "") -> ModelNotFound:
    where = f"the HF cache ({cache})"
    if offline_reason:
        hint_tail = "unset HF_HUB_OFFLINE" if "HF_HUB_OFFLINE" in offline_reason else "drop --offline"
        return ModelNotFound(
            f"{spec.name} is not in {where}{detail} and offline mode is on ({offline_reason})",
            hint=f"run `lucebox pull {spec.name}` with network access, or {hint_tail}",
        )
    return ModelNotFound(f"{spec.name} is not in {where}{detail}", hint=f"run `lucebox pull {spec.name}` first")


def _offline_reason(offline: bool | None) -> str | None:
    if offline:
        return "--offline"
    if env_offline():
        return "HF_HUB_OFFLINE=1"
    return None


# ----------------------------------------------------------------------------- local lookups (no network)


def _local_result(spec: ModelSpec) -> PullResult:
    assert spec.local_path is not None
    root = spec.local_path
    paths = [root] if root.is_file() else sorted(p for p in root.iterdir() if p.is_file())
    files = tuple(
        PulledFile(repo_id="", path=p.name, size=p.stat().st_size, local_path=p, role="target") for p in paths
    )
    folder = root if root.is_dir() else root.parent
    repo = RepoResult(repo_id="", revision="local", commit=None, roles=("target",), snapshot=folder)
    return PullResult(name=spec.name, repos=(repo,), files=files, cache_dir=None, offline=True)


def _missing_shards(paths: list[str]) -> list[str]:
    """Shard names (`-00002-of-00003.`) absent from a set whose other shards are present."""
    missing: list[str] = []
    for p in paths:
        m = _SHARD_RE.search(p)
        if not m:
            continue
        total = int(m.group(2))
        for k in range(1, total + 1):
            sibling = p[: m.start()] + f"-{k:05d}-of-{total:05d}." + p[m.end() :]
            if sibling not in paths and sibling not in missing:
                missing.append(sibling)
    return missing


def find_local(spec: ModelSpec, include: list[str] | None = None, offline: bool | None = None) -> PullResult:
    """The spec's files already in the HF cache (or at its local path); never touches the network.

    Raises ModelNotFound (one line, hint `lucebox pull NAME`) when a repo, a role or a shard is missing.
    """
    if spec.is_local:
        return _local_result(spec)
    cache = cache_dir()
    reason = _offline_reason(offline)
    repos: list[RepoResult] = []
    files: list[PulledFile] = []
    for repo_id, revision, rfs in _groups(spec):
        storage = _storage(cache, repo_id)
        commit = _cached_commit(storage, revision)
        snapshot = storage / "snapshots" / commit if commit else None
        if snapshot is None or not snapshot.is_dir():
            # With --include, a repo the patterns never reach need not be cached (checked below: any files at all).
            if include:
                continue
            raise _not_cached(spec, cache, reason)
        found: list[PulledFile] = []
        for p in sorted(snapshot.rglob("*")):
            rel = p.relative_to(snapshot).as_posix()
            role = _role_of(rel, rfs, include)
            # is_file follows the snapshot symlink: a dangling link (blob deleted) is not a cached file.
            if role and p.is_file():
                found.append(PulledFile(repo_id, rel, p.stat().st_size, p, role))
        roles_found = {f.role for f in found}
        for rf in rfs:
            if rf.role not in roles_found and not include:
                raise _not_cached(spec, cache, reason, f" (no {rf.role} files of {repo_id})")
        missing = _missing_shards([f.path for f in found])
        if missing:
            raise _not_cached(spec, cache, reason, f" ({repo_id} lacks {missing[0]})")
        repos.append(RepoResult(repo_id, revision, commit, tuple(rf.role for rf in rfs), snapshot))
        files.extend(found)
    if not files:
        raise _not_cached(spec, cache, reason, f" (nothing matches {', '.join(include or [])})")
    return PullResult(spec.name, tuple(repos), tuple(files), cache, offline=reason is not None)


# ----------------------------------------------------------------------------- planning (hub metadata)


def _hub_error(err: Exception, what: str) -> Exception:
    """Map huggingface_hub / transport errors to one-line LuceboxErrors."""
    import httpx2
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if isinstance(err, GatedRepoError):
        return DownloadError(
            f"{what} is gated: access not granted", hint="accept its license on the hub, then set HF_TOKEN"
        )
    if isinstance(err, RepositoryNotFoundError):
        return ModelNotFound(
            f"{what} not found on {endpoint()}", hint="check the repo name; private repos need HF_TOKEN"
        )
    if isinstance(err, RevisionNotFoundError):
        return ModelNotFound(f"revision not found for {what}", hint="check --revision (a branch, tag or commit)")
    if isinstance(err, OfflineModeIsEnabled):
        return DownloadError(
            f"cannot reach the hub for {what}: offline mode is on (HF_HUB_OFFLINE=1)",
            hint="unset HF_HUB_OFFLINE, or use --offline to read the cache only",
        )
    if isinstance(err, HfHubHTTPError):
        return DownloadError(f"hub error for {what}: {first}", hint="retry later; check HF_ENDPOINT and HF_TOKEN")
    if isinstance(err, (httpx2.TransportError, OSError)):
        return DownloadError(
            f"network error for {what} ({endpoint()}): {first}",
            hint="check the connection, proxy and HF_ENDPOINT, then rerun (downloads resume); "
            "--offline uses the cache only",
        )
    return err


def _repo_listing(repo_id: str, revision: str) -> tuple[str, list[Any]]:
    """(commit, siblings with size/blob id/LFS sha256) of one repo revision."""
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, HFValidationError, OfflineModeIsEnabled

    api = HfApi(endpoint=endpoint(), token=_token(), library_name="lucebox", library_version=__version__)
    try:
        info = api.model_info(repo_id, revision=revision, files_metadata=True, timeout=_download_timeout())
    except (HfHubHTTPError, OfflineModeIsEnabled, httpx2.TransportError, OSError) as err:
        raise _hub_error(err, f"{repo_id}@{revision}") from err
    except HFValidationError as err:
        raise ModelNotFound(f"invalid hub repo or revision {repo_id}@{revision}: {err}", hint="use `org/repo`") from err
    if not info.sha or info.siblings is None:
        raise DownloadError(
            f"{endpoint()} returned no commit or file list for {repo_id}",
            hint="HF_ENDPOINT must point at a Hugging Face hub (or mirror)",
        )
    return info.sha, list(info.siblings)


def _available_ggufs(siblings: list[Any]) -> str:
    names = sorted(s.rfilename for s in siblings if s.rfilename.endswith(".gguf"))
    shown = ", ".join(names[:8]) + (", …" if len(names) > 8 else "")
    return f"files there: {shown}" if names else "the repo has no .gguf files"


def _plan_repo(
    spec: ModelSpec, cache: Path, repo_id: str, revision: str, rfs: list[RepoFiles], include: list[str] | None
) -> list[PlannedFile]:
    commit, siblings = _repo_listing(repo_id, revision)
    storage = _storage(cache, repo_id)
    out: list[PlannedFile] = []
    for s in siblings:
        role = _role_of(s.rfilename, rfs, include)
        if role is None:
            continue
        sha = s.lfs.sha256 if s.lfs else None
        size = s.lfs.size if s.lfs else s.size
        cached = _pointer(storage, commit, s.rfilename).is_file()
        out.append(PlannedFile(repo_id, s.rfilename, int(size or 0), sha, commit, role, s.blob_id, cached))
    if not include:
        for rf in rfs:
            if not any(f.role == rf.role for f in out):
                hint = _available_ggufs(siblings) if spec.format == "gguf" else "check the repo and revision"
                raise ModelNotFound(
                    f"no {rf.role} files in {repo_id}@{revision} match {', '.join(rf.allow_patterns)}", hint=hint
                )
    return out


def plan(spec: ModelSpec, include: list[str] | None = None, offline: bool | None = None) -> list[PlannedFile]:
    """The files `download` would fetch (size, sha256, commit, cached?). Offline: what the cache holds."""
    if spec.is_local or _offline_reason(offline):
        local = find_local(spec, include, offline)
        commits = {r.repo_id: r.commit or "" for r in local.repos}
        return [
            PlannedFile(f.repo_id, f.path, f.size, None, commits.get(f.repo_id, ""), f.role, cached=True)
            for f in local.files
        ]
    cache = cache_dir()
    files: list[PlannedFile] = []
    for repo_id, revision, rfs in _groups(spec):
        files.extend(_plan_repo(spec, cache, repo_id, revision, rfs, include))
    if not files:
        raise ModelNotFound(
            f"no files of {spec.name} match --include {' '.join(include or [])}",
            hint="`lucebox pull NAME --dry-run` lists the files",
        )
    return files


# ----------------------------------------------------------------------------- download (the bytes: hub_transfer.py)


def _transport() -> HubTransport:
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import get_session, hf_raise_for_status

    return HubTransport(session=get_session, raise_for_status=hf_raise_for_status, http_error=HfHubHTTPError,
                        transport_error=httpx2.TransportError, map_error=_hub_error, timeout=_download_timeout)


def _fetch(file: PlannedFile, cache: Path, headers: dict[str, str], progress: ProgressFn | None,
           transport: HubTransport) -> Path:
    """Download one file into the cache (blob + snapshot link) unless already there; returns the link."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import WeakFileLock

    storage = _storage(cache, file.repo_id)
    pointer = _pointer(storage, file.revision, file.path)
    if pointer.is_file():
        return pointer
    etag = file.etag
    if not etag:
        raise DownloadError(
            f"the hub gave no hash for {file.repo_id}/{file.path}", hint="HF_ENDPOINT must point at a HF hub"
        )
    blob = storage / "blobs" / etag
    blob.parent.mkdir(parents=True, exist_ok=True)
    # Same lock file huggingface_hub uses, so a concurrent hf_hub_download of this blob waits for us.
    lock = cache / ".locks" / storage.name / f"{etag}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(lock):
        if not blob.is_file():
            url = hf_hub_url(file.repo_id, file.path, revision=file.revision, endpoint=endpoint())
            partial = blob.with_name(etag + ".incomplete")
            check_space(blob.parent, file.size - size_on_disk(partial), f"{file.repo_id}/{file.path}")
            stream_to(url, partial, file, headers, progress, transport)
            verify(partial, file)
            os.replace(partial, blob)
        link(blob, pointer)
    return pointer


def _write_ref(storage: Path, revision: str, commit: str) -> None:
    if _COMMIT_RE.match(revision):
        return
    ref = storage / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    if not ref.is_file() or ref.read_text().strip() != commit:
        ref.write_text(commit)


def download(
    spec: ModelSpec,
    include: list[str] | None = None,
    offline: bool | None = None,
    progress: ProgressFn | None = None,
) -> PullResult:
    """Fetch the spec's files into the HF cache (skipping cached ones) and return where they are.

    `offline=None` follows HF_HUB_OFFLINE; offline serves from the cache or raises ModelNotFound.
    """
    if spec.is_local or _offline_reason(offline):
        return find_local(spec, include, offline)
    from huggingface_hub.utils import build_hf_headers

    cache = cache_dir()
    # identity: byte counts must match Content-Length and the hub's sizes, and Range offsets the file.
    headers = build_hf_headers(
        token=_token(), library_name="lucebox", library_version=__version__, headers={"Accept-Encoding": "identity"}
    )
    transport = _transport()
    repos: list[RepoResult] = []
    pulled: list[PulledFile] = []
    for repo_id, revision, rfs in _groups(spec):
        files = _plan_repo(spec, cache, repo_id, revision, rfs, include)
        if not files:
            continue
        for f in files:
            pointer = _fetch(f, cache, headers, progress, transport)
            if progress:
                progress(f, f.size)
            pulled.append(PulledFile(f.repo_id, f.path, f.size, pointer, f.role, f.sha256))
        storage = _storage(cache, repo_id)
        commit = files[0].revision
        # The ref moves only once every file of the commit is in place, so lookups never see half a snapshot.
        _write_ref(storage, revision, commit)
        snapshot = storage / "snapshots" / commit
        repos.append(RepoResult(repo_id, revision, commit, tuple(rf.role for rf in rfs), snapshot))
    if not pulled:
        raise ModelNotFound(
            f"no files of {spec.name} match --include {' '.join(include or [])}",
            hint="`lucebox pull NAME --dry-run` lists the files",
        )
    return PullResult(spec.name, tuple(repos), tuple(pulled), cache, offline=False)


def download_dataset(repo_id: str, filename: str, offline: bool | None = None) -> Path:
    """One file of a hub *dataset* repo (bench prompts) into the HF cache; returns its local path.

    Dataset files are small, so huggingface_hub's own downloader serves them (no resume needed);
    offline (or HF_HUB_OFFLINE) reads the cache only.
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    local_only = _offline_reason(offline) is not None
    try:
        return Path(hf_hub_download(
            repo_id, filename, repo_type="dataset", cache_dir=cache_dir(), endpoint=endpoint(),
            token=_token(), local_files_only=local_only,
        ))
    except LocalEntryNotFoundError:
        raise DownloadError(
            f"dataset {repo_id}/{filename} is not in the HF cache"
            + (" and offline mode is on" if local_only else " and the hub could not be reached"),
            hint="rerun with network access (the file is cached for next time), or pass --dataset FILE.jsonl",
        ) from None
    except Exception as err:  # noqa: BLE001 - mapped to one-line errors; unknown ones re-raised
        mapped = _hub_error(err, f"dataset {repo_id}/{filename}")
        if mapped is err:
            raise
        raise mapped from None
