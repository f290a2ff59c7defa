"""Models by name: an alias of the catalog, or any ONNX Runtime GenAI folder on the Hugging Face Hub, downloaded
through ``huggingface_hub`` and checked before it is used.

``python -m phi_api pull NAME`` (and ``make pull MODEL=NAME``, ``MODEL=NAME`` for the server): NAME is an alias
(:data:`CATALOG`) or ``REPO[/SUBFOLDER][@REVISION]``. The client brings the Hub's cache (``HF_HOME``), its
endpoint (``HF_ENDPOINT``), a token for gated repositories (``HF_TOKEN``, never logged), proxies (the usual
variables), resumed transfers and ``HF_HUB_OFFLINE``. What it does not do, phi-api does here:

- refuse a repository or subfolder that is not an ONNX Runtime GenAI model (no ``genai_config.json``) or an
  encoder folder as ``phi-api prepare-model`` writes them (no ``encoder_config.json``) before downloading anything;
- check the free disk space first, and say what is needed and what is free;
- check every downloaded file against the hash the Hub announces (SHA-256 for LFS files, the git blob id for
  the others): the client checks sizes only. A file that does not match is removed, and named;
- remember, in the client's cache, a pinned commit's folder once checked: serving it again needs no network;
- turn the client's failures (its own errors, and its HTTP library's when a transfer keeps failing) into one
  line, :class:`PullError`.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phi_api.engine.encoder.folder import ENCODER_CONFIG
from phi_api.engine.runtime.folder import CONFIG_FILE as GENAI_CONFIG
from phi_api.errors import PullError

MARKERS = (GENAI_CONFIG, ENCODER_CONFIG)  # what makes a folder a model phi-api serves
SIZE_SLACK = 1 << 20  # bytes a download may pass what the Hub declared before it is stopped (headers, a resumed block)
# A download slower than STALL_BYTES in STALL_SECONDS (~1 KB/s) is stopped: a Hub trickling bytes
STALL_SECONDS = 60
STALL_BYTES = 64 << 10


@dataclass(frozen=True)
class Source:
    """Where a model is on the Hub."""

    repo: str
    subfolder: str = ""
    revision: str = "main"
    size: str = ""  # for the catalog's listing

    @property
    def pattern(self) -> str | None:
        return f"{self.subfolder}/*" if self.subfolder else None


# The production model's CPU build, at a pinned commit (the README lists the catalog).
CATALOG = {
    "phi-3.5-mini": Source("microsoft/Phi-3.5-mini-instruct-onnx", "cpu_and_mobile/cpu-int4-awq-block-128-acc-level-4",
                           "4236bc73154e9bc39c97ebcc28c4897a0454a815", "2.7 GB"),
}


_SEGMENT = re.compile(r"[A-Za-z0-9._-]{1,96}")  # the Hub's names; never empty, never a path
_REVISION = re.compile(r"[A-Za-z0-9._-]{1,128}")


def parse(name: str) -> Source:
    """An alias, or ``REPO[/SUBFOLDER][@REVISION]``."""
    if name in CATALOG:
        return CATALOG[name]
    path, _, revision = name.partition("@")
    parts = path.split("/")
    if not all(_SEGMENT.fullmatch(part) and part not in (".", "..") for part in parts) or \
            ("@" in name and not _REVISION.fullmatch(revision)):
        raise PullError(f"'{name}' is not a model name: OWNER/NAME[/SUBFOLDER][@REVISION], each part letters, digits, "
                        "'.', '_' or '-' (no empty, '.' or '..' parts)")
    if len(parts) < 2:
        known = ", ".join(CATALOG)
        raise PullError(f"'{name}' is neither a model of the catalog ({known}) nor a Hub repository "
                        "(OWNER/NAME[/SUBFOLDER][@REVISION])")
    return Source("/".join(parts[:2]), "/".join(parts[2:]), revision or "main")


def pull(name: str, say: Callable[[str], None] = lambda line: None,
         report: Callable[[dict[str, Any]], None] = lambda event: None) -> Path:
    """Download the model ``name`` names (files already in the cache are not downloaded again), check it, and
    return its folder; :class:`PullError` if it cannot be had. ``say``: progress as lines; ``report``: as
    Ollama's pull events (``status``, and ``digest``, ``total``, ``completed`` while downloading)."""
    source = parse(name)
    try:
        return _pull(source, say, report)
    except PullError:
        raise
    except Exception as error:  # the client's and its HTTP library's errors: one line, never a traceback
        raise PullError(f"could not pull {name}: {_reason(error)}") from None


def _pull(source: Source, say: Callable[[str], None], report: Callable[[dict[str, Any]], None]) -> Path:
    from huggingface_hub import HfApi, constants, snapshot_download

    if constants.HF_HUB_OFFLINE or _verified(source):  # a pinned commit pulled and checked before: no network
        folder = Path(snapshot_download(source.repo, revision=source.revision, allow_patterns=source.pattern,
                                        local_files_only=True)) / source.subfolder
        _check_folder(folder, source)
        return folder
    api = HfApi()
    report({"status": "pulling manifest"})
    files = _files(api, source)
    needed = sum(entry.size for entry in files)
    _check_space(needed, Path(constants.HF_HUB_CACHE))
    say(f"pulling {source.repo}{'/' + source.subfolder if source.subfolder else ''} at {source.revision}: "
        f"{len(files)} files, {needed / 2**20:.0f} MB")
    with Watcher(source, files, report):
        root = Path(snapshot_download(source.repo, revision=source.revision, allow_patterns=source.pattern,
                                      tqdm_class=_bounded(needed + SIZE_SLACK)))
    report({"status": "verifying sha256 digest"})
    _verify(root, files, say)
    folder = root / source.subfolder
    _check_folder(folder, source)
    if _pinned(source):
        _mark(source).parent.mkdir(parents=True, exist_ok=True)
        _mark(source).write_text(str(folder), encoding="utf-8")
    return folder


class Watcher:
    """While the client downloads: Ollama's progress events, from the sizes of the cache's blobs (finished and
    ``.incomplete``), every half second, on a thread of its own."""

    def __init__(self, source: Source, files: list[Any], report: Callable[[dict[str, Any]], None]) -> None:
        from huggingface_hub import constants
        from huggingface_hub.file_download import repo_folder_name

        self.blobs = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=source.repo, repo_type="model") / "blobs"
        self.ids = [entry.lfs.sha256 if entry.lfs is not None else entry.blob_id for entry in files]
        self.total = sum(entry.size for entry in files)
        self.digest = "sha256:" + hashlib.sha256(":".join(self.ids).encode()).hexdigest()
        self.report = report
        self.done = threading.Event()

    def __enter__(self) -> Watcher:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.done.set()
        self._tell()

    def _run(self) -> None:
        while not self.done.wait(0.5):
            self._tell()

    def _tell(self) -> None:
        completed = sum(_size(self.blobs / blob) or _size(self.blobs / f"{blob}.incomplete") for blob in self.ids)
        self.report({"status": f"pulling {self.digest[7:19]}", "digest": self.digest, "total": self.total,
                     "completed": min(completed, self.total)})


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _pinned(source: Source) -> bool:
    """Whether the revision is a commit (whose files never change), not a branch or a tag."""
    return len(source.revision) == 40 and all(char in "0123456789abcdef" for char in source.revision)


def _mark(source: Source) -> Path:
    from huggingface_hub import constants

    key = hashlib.sha256(f"{source.repo}@{source.revision}/{source.subfolder}".encode()).hexdigest()[:24]
    return Path(constants.HF_HUB_CACHE) / ".phi-api-verified" / key


def _verified(source: Source) -> bool:
    """Whether this pinned commit's folder was pulled and checked in this cache, and is still whole."""
    mark = _mark(source)
    return _pinned(source) and mark.is_file() and _is_model(Path(mark.read_text(encoding="utf-8")))


def _files(api: Any, source: Source) -> list[Any]:
    """The model's files on the Hub (with their sizes and hashes); refused unless it is an ONNX Runtime GenAI
    folder."""
    from huggingface_hub.hf_api import RepoFile

    entries = api.list_repo_tree(source.repo, path_in_repo=source.subfolder or None, recursive=True,
                                 revision=source.revision)
    files = [entry for entry in entries if isinstance(entry, RepoFile)]
    strays = [entry.path for entry in files if not _within(entry.path, source.subfolder)]
    if strays:  # its files are checked, and removed when they do not match: a name must not lead out of the cache
        raise PullError(f"the Hub's listing of {source.repo} names a file outside the repository's folder "
                        f"({strays[0]!r}); nothing was downloaded")
    configs = {f"{source.subfolder}/{name}" if source.subfolder else name for name in MARKERS}
    if not any(entry.path in configs for entry in files):
        where = f"{source.repo}/{source.subfolder}" if source.subfolder else source.repo
        raise PullError(f"{where} is not an ONNX Runtime GenAI model folder: it has no {GENAI_CONFIG} (nor an "
                        f"encoder's {ENCODER_CONFIG})")
    return files


def _bounded(most: int, clock: Callable[[], float] = time.monotonic) -> type:
    """snapshot_download's progress bars, which stop the download once more than ``most`` bytes came, or when less
    than :data:`STALL_BYTES` came in :data:`STALL_SECONDS`: the room checked for is what the Hub declared, and a
    broken or hostile Hub that sends more (or without end) must not fill the disk, nor one that trickles bytes hold a
    pull (and its process) for ever. (huggingface_hub checks a file's size only once it has it all, and its read
    timeout is met by a byte now and then.)"""
    from huggingface_hub.utils import tqdm as hub_tqdm

    class Bounded(hub_tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.bytes = kwargs.get("unit") == "B"  # (the bar of files counts files)
            self.came = 0.0  # (a disabled bar counts nothing itself)
            self.window: tuple[float, float] | None = None  # when the current window of STALL_SECONDS began (at
            # the first bytes: the files' metadata is asked first), and what had come by then
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if self.bytes:
                self.came += n or 0  # a resumed file starts again: n < 0
                if self.came > most:
                    raise PullError(f"the Hub sent more than the {most / 2**20:.0f} MB it declared; stopped")
                self._check_pace()
            return super().update(n)

        def _check_pace(self) -> None:
            if self.window is None:
                self.window = (clock(), 0.0)
            began, came = self.window
            if clock() - began >= STALL_SECONDS:
                if self.came - came < STALL_BYTES:
                    raise PullError(f"the Hub sent less than {STALL_BYTES // 1024} KB in {STALL_SECONDS} s; stopped")
                self.window = (clock(), self.came)

    return Bounded


def _within(path: str, subfolder: str) -> bool:
    """Whether a listed file's ``path`` is a plain relative path inside the repository's ``subfolder``: no root, no
    empty, ``.`` or ``..`` part."""
    parts = path.split("/")
    inside = not subfolder or parts[:subfolder.count("/") + 1] == subfolder.split("/")
    return inside and all(part not in ("", ".", "..") for part in parts)


def _check_space(needed: int, cache: Path) -> None:
    probe = cache
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed > free:
        raise PullError(f"not enough disk space in {cache}: {needed / 2**30:.1f} GB needed, {free / 2**30:.1f} GB "
                        "free")


def _verify(root: Path, files: list[Any], say: Callable[[str], None]) -> None:
    """Check each file against the hash the Hub announced; remove and name those that do not match."""
    bad = []
    for entry in files:
        path = root / entry.path
        expected = entry.lfs.sha256 if entry.lfs is not None else entry.blob_id
        if _file_hash(path, lfs=entry.lfs is not None) != expected.lower():
            bad.append(entry.path)
            _remove_cached(path)
    if bad:
        raise PullError(f"{', '.join(bad)}: the bytes downloaded do not match the hash the Hub announces; removed "
                        "(pull again)")
    say(f"checked {len(files)} files against the Hub's hashes")


def _file_hash(path: Path, lfs: bool) -> str:
    """The hash the Hub announces for a file: sha256 of an LFS file's bytes, else git's blob hash (small files)."""
    from huggingface_hub.utils.sha import git_hash, sha_fileobj

    if lfs:
        with path.open("rb") as stream:
            return sha_fileobj(stream).hex()
    return git_hash(path.read_bytes())


def _remove_cached(path: Path) -> None:
    """Remove a snapshot's file and the cached blob it links to."""
    target = path.resolve()
    for item in (path, target):
        try:
            item.unlink()
        except OSError:
            pass


def _is_model(folder: Path) -> bool:
    return any((folder / name).is_file() for name in MARKERS)


def _check_folder(folder: Path, source: Source) -> None:
    if not _is_model(folder):
        raise PullError(f"{folder} has no {GENAI_CONFIG} (nor {ENCODER_CONFIG}): {source.repo} is not a model "
                        "phi-api serves here")


def _reason(error: BaseException) -> str:
    """A client error as one line (its first, without the library's hints)."""
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def catalog_lines() -> list[str]:
    return [f"{alias}: {source.repo}/{source.subfolder} ({source.size})" for alias, source in CATALOG.items()]


def in_subprocess(name: str) -> Iterator[dict[str, Any]]:
    """Pull ``name`` in a process of its own (``python -m phi_api pull --json``: downloading and hashing gigabytes
    never hold up a server's worker), yielding its events; the last is ``{"status": "success", "path": ...}`` or
    ``{"error": ...}``."""
    process = subprocess.Popen([sys.executable, "-m", "phi_api", "pull", "--json", "--", name], stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    last: dict[str, Any] = {}
    try:
        assert process.stdout is not None
        for line in process.stdout:
            try:
                last = json.loads(line)
            except ValueError:
                continue
            yield last
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    if "error" not in last and last.get("status") != "success":
        yield {"error": f"could not pull {name}: the download stopped (exit status {process.returncode})"}

