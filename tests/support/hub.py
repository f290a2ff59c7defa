"""A stand-in for the Hugging Face Hub on loopback, for the real ``huggingface_hub`` client (``HF_ENDPOINT``).

It serves model repositories held in memory at one commit each: ``/api/models/{repo}/revision/{rev}`` (the
repository's info), ``/api/models/{repo}/tree/{rev}[/{path}]`` (its files, with their git and LFS ids), and
``/{repo}/resolve/{rev}/{path}`` (a file, HEAD and GET, with the headers the client reads and Range requests).
Every file of 1 KB or more is announced as an LFS file (its SHA-256 as its id). Faults on demand: a transfer cut
midway (``cuts``), bytes that do not match the announced hash (``corrupt``). It counts the file transfers it
serves (``downloads``).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

LFS_FROM = 1024


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str = "0" * 40
    corrupt: set[str] = field(default_factory=set)  # served with other bytes than announced
    # named only in the listing of the branch (phi-api's own look), not in that of its commit (the download's)
    listed_only: list[str] = field(default_factory=list)
    padded: dict[str, int] = field(default_factory=dict)  # path -> bytes sent past those announced (not in a HEAD)

    def entry(self, path: str) -> dict:
        data = self.files[path]
        item: dict = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": path}
        if len(data) >= LFS_FROM:
            item["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return item

    def served(self, path: str) -> bytes:
        data = self.files[path]
        if path in self.corrupt:
            return bytes([data[0] ^ 0xFF]) + data[1:]
        return data


class Hub(http.server.ThreadingHTTPServer):
    """The stand-in; ``url`` is its ``HF_ENDPOINT``. Use it as a context manager."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.cuts: Counter[str] = Counter()  # path -> how many more transfers of it to cut midway
        self.downloads: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()  # path -> bytes written to clients in whole transfers
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def add(self, repo_id: str, folder: Path, subfolder: str = "", commit: str = "c0ffee" * 6 + "c0ff") -> Repo:
        """Serve ``folder``'s files as ``repo_id`` (under ``subfolder``), at ``commit``."""
        prefix = f"{subfolder}/" if subfolder else ""
        files = {prefix + path.relative_to(folder).as_posix(): path.read_bytes()
                 for path in sorted(folder.rglob("*")) if path.is_file()}
        files["README.md"] = b"# A stand-in repository\n"
        self.repos[repo_id] = repo = Repo(files, commit)
        return repo

    def __enter__(self) -> Hub:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()
        self.server_close()


_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/(?P<kind>revision|tree)/(?P<rev>[^/]+)(?P<path>/.*)?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Hub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _route(self, head: bool) -> None:
        path = unquote(urlparse(self.path).path)
        api, resolve = _API.match(path), _RESOLVE.match(path)
        match = api or resolve
        repo = self.server.repos.get(match["repo"]) if match else None
        if match is None or repo is None or match["rev"] not in ("main", repo.commit):
            return self._json(404, {"error": "Repository not found"}, head, {"X-Error-Code": "RepoNotFound"})
        if api and api["kind"] == "revision":
            return self._json(200, {"id": api["repo"], "modelId": api["repo"], "sha": repo.commit, "private": False,
                                    "siblings": [{"rfilename": name} for name in repo.files]}, head)
        if api:
            extra = [{"type": "file", "oid": "0" * 40, "size": 1, "path": path}
                     for path in repo.listed_only if api["rev"] == "main"]
            return self._json(200, self._tree(repo, (api["path"] or "").strip("/")) + extra, head)
        return self._file(repo, resolve["path"], head)

    def _tree(self, repo: Repo, under: str) -> list[dict]:
        names = [name for name in repo.files if not under or name.startswith(under + "/")]
        folders = sorted({"/".join(name.split("/")[:depth]) for name in names
                          for depth in range(1, name.count("/") + 1)} - {under})
        return [{"type": "directory", "oid": "0" * 40, "size": 0, "path": folder} for folder in folders] + \
            [repo.entry(name) for name in names]

    def _file(self, repo: Repo, path: str, head: bool) -> None:
        if path not in repo.files:
            return self._json(404, {"error": "Entry not found"}, head, {"X-Error-Code": "EntryNotFound"})
        entry, data = repo.entry(path), repo.served(path)
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{entry["oid"]}"', "Accept-Ranges": "bytes"}
        if "lfs" in entry:
            headers.update({"X-Linked-Etag": f'"{entry["lfs"]["oid"]}"', "X-Linked-Size": str(len(data))})
        start = int(re.match(r"bytes=(\d+)-", self.headers.get("Range", "bytes=0-"))[1])  # type: ignore[index]
        status = 206 if start else 200
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:] + (b"\0" * repo.padded.get(path, 0) if not head else b"")
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body)),
                            "Content-Type": "application/octet-stream"}.items():
            self.send_header(name, value)
        self.end_headers()
        if head:
            return
        self.server.downloads[path] += 1
        if self.server.cuts[path] > 0:  # half of it, then the connection drops
            self.server.cuts[path] -= 1
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        for offset in range(0, len(body), 1 << 20):  # what the client takes, counted
            self.wfile.write(body[offset:offset + (1 << 20)])
            self.server.sent[path] += len(body[offset:offset + (1 << 20)])

    def _json(self, status: int, value: object, head: bool, extra: dict[str, str] | None = None) -> None:
        body = json.dumps(value).encode()
        self.send_response(status)
        for name, header in {"Content-Type": "application/json", "Content-Length": str(len(body)),
                             **(extra or {})}.items():
            self.send_header(name, header)
        self.end_headers()
        if not head:
            self.wfile.write(body)


def main() -> None:
    """``python -m tests.support.hub FOLDER REPO [SUBFOLDER]``: serve a model folder as a repository on loopback
    until interrupted (for timing ``python -m phi_api pull`` by hand, with ``HF_ENDPOINT`` set to the printed URL)."""
    import sys

    folder, repo = Path(sys.argv[1]), sys.argv[2]
    with Hub() as hub:
        hub.add(repo, folder, sys.argv[3] if len(sys.argv) > 3 else "")
        print(hub.url, flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
