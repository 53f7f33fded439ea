"""A local stand-in for the Hugging Face hub: the slice of its HTTP API that huggingface_hub and hub.py use.

Served on 127.0.0.1 (random port) from a thread:
- GET /api/models/{repo} (or /api/datasets/{repo}: datasets share the one repo table)[/revision/{rev}][?blobs=true]: model info with `sha` and `siblings`
  (`rfilename`, `size`, `blobId`, and `lfs: {sha256, size, pointerSize}` for LFS files);
- HEAD/GET /{repo}/resolve/{rev}/{path}: regular files answered directly (ETag = git blob sha1),
  LFS files redirected (302) to /cdn/{sha256} with X-Linked-Etag / X-Linked-Size, like the real hub;
  X-Repo-Commit, Content-Length, Accept-Ranges, and `Range: bytes=N-` → 206 with Content-Range;
- 404s carry X-Error-Code (RepoNotFound / RevisionNotFound / EntryNotFound) as the hub does.
No xet headers are ever sent, so huggingface_hub never switches to xet.

Faults, per file path: `cut[path] = K` closes the connection after K body bytes (once per arm);
`corrupt.add(path)` serves bytes that differ from the advertised sha256 (same length);
`fail[path] = [503, ...]` answers the next GETs of its bytes with those statuses, one per request;
`refuse_ranges = True` answers Range requests with 403 (a signed URL that expired after a cut).
Every request is logged in `requests` as (method, url path, headers dict).
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _lfs_pointer(data: bytes) -> bytes:
    return (
        "version https://git-lfs.github.com/spec/v1\n"
        f"oid sha256:{hashlib.sha256(data).hexdigest()}\nsize {len(data)}\n"
    ).encode()


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, bytes]
    lfs: set[str]
    commit: str

    def sibling(self, path: str) -> dict:
        data = self.files[path]
        if path in self.lfs:
            pointer = _lfs_pointer(data)
            return {
                "rfilename": path,
                "size": len(data),
                "blobId": git_blob_sha1(pointer),
                "lfs": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": len(pointer)},
            }
        return {"rfilename": path, "size": len(data), "blobId": git_blob_sha1(data)}


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    cut: dict[str, int] = field(default_factory=dict)
    corrupt: set[str] = field(default_factory=set)
    refuse_ranges: bool = False
    fail: dict[str, list[int]] = field(default_factory=dict)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    url: str = ""
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_repo(self, repo_id: str, files: dict[str, bytes], lfs_suffixes=(".gguf", ".safetensors")) -> str:
        digest = hashlib.sha1(repo_id.encode())
        for path in sorted(files):
            digest.update(path.encode() + b"\0" + files[path])
        commit = digest.hexdigest()
        lfs = {p for p in files if p.endswith(tuple(lfs_suffixes))}
        self.repos[repo_id] = FakeRepo(repo_id, dict(files), lfs, commit)
        return commit

    def gets(self, path_suffix: str) -> list[dict[str, str]]:
        """Headers of the GETs whose URL path ends with `path_suffix`."""
        return [h for m, p, h in self.requests if m == "GET" and p.endswith(path_suffix)]

    def start(self) -> FakeHub:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-hub", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def blob(self, sha256: str) -> tuple[FakeRepo, str] | None:
        for repo in self.repos.values():
            for path in repo.lfs:
                if hashlib.sha256(repo.files[path]).hexdigest() == sha256:
                    return repo, path
        return None

    def take_cut(self, path: str) -> int | None:
        with self._lock:
            return self.cut.pop(path, None)

    def take_fail(self, path: str) -> int | None:
        with self._lock:
            queue = self.fail.get(path)
            return queue.pop(0) if queue else None


_INFO_RE = re.compile(r"^/api/(?:models|datasets)/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
_RESOLVE_RE = re.compile(r"^(?:/datasets)?/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_CDN_RE = re.compile(r"^/cdn/(?P<sha>[0-9a-f]{64})$")
_RANGE_RE = re.compile(r"^bytes=(\d+)-$")


def _make_handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # keep pytest output clean
            pass

        def do_GET(self) -> None:
            self._route(head=False)

        def do_HEAD(self) -> None:
            self._route(head=True)

        def _route(self, head: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.requests.append(("HEAD" if head else "GET", path, dict(self.headers.items())))
            if m := _INFO_RE.match(path):
                return self._info(m["repo"], m["rev"] or "main")
            if m := _RESOLVE_RE.match(path):
                return self._resolve(m["repo"], m["rev"], m["path"], head)
            if m := _CDN_RE.match(path):
                found = hub.blob(m["sha"])
                if found:
                    return self._send_file(found[0], found[1], head, etag=m["sha"])
            self._error(404, "EntryNotFound")

        def _repo_rev(self, repo_id: str, rev: str) -> FakeRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound")
                return None
            if rev not in ("main", repo.commit):
                self._error(404, "RevisionNotFound")
                return None
            return repo

        def _info(self, repo_id: str, rev: str) -> None:
            repo = self._repo_rev(repo_id, rev)
            if repo is None:
                return
            body = {
                "_id": "0" * 24,
                "id": repo_id,
                "modelId": repo_id,
                "sha": repo.commit,
                "private": False,
                "siblings": [repo.sibling(p) for p in sorted(repo.files)],
            }
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _resolve(self, repo_id: str, rev: str, path: str, head: bool) -> None:
            repo = self._repo_rev(repo_id, rev)
            if repo is None:
                return
            if path not in repo.files:
                return self._error(404, "EntryNotFound", commit=repo.commit)
            if path in repo.lfs:
                sha = hashlib.sha256(repo.files[path]).hexdigest()
                self.send_response(302)
                self.send_header("Location", f"{hub.url}/cdn/{sha}")
                self.send_header("X-Repo-Commit", repo.commit)
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(len(repo.files[path])))
                self.send_header("ETag", f'"{git_blob_sha1(_lfs_pointer(repo.files[path]))}"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self._send_file(repo, path, head, etag=git_blob_sha1(repo.files[path]))

        def _send_file(self, repo: FakeRepo, path: str, head: bool, etag: str) -> None:
            data = repo.files[path]
            if path in hub.corrupt:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            start = 0
            m = _RANGE_RE.match(self.headers.get("Range", ""))
            status = None if head else hub.take_fail(path)
            if status is not None:
                return self._error(status, "Injected")
            if m and hub.refuse_ranges:
                return self._error(403, "Forbidden")
            if m:
                start = int(m.group(1))
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
            body = data[start:]
            self.send_response(206 if m else 200)
            if m:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{etag}"')
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            if head:
                return
            cut = hub.take_cut(path)
            if cut is not None:
                self.wfile.write(body[:cut])
                self.wfile.flush()
                # Drop the connection mid-body: the client sees fewer bytes than Content-Length.
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.wfile.write(body)

        def _error(self, status: int, code: str, commit: str | None = None) -> None:
            data = json.dumps({"error": f"{code}: {self.path}"}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", code)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
