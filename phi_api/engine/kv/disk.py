"""The disk tier of prefix reuse: prompts' keys and values in files, shared by every worker and kept across restarts.

At Phi-3.5-mini's size two cores prefill about 90 tokens a second, while a
local disk gives back a token's 196 KB of int8 keys and values in
microseconds. So every prompt's keys and values are written to a folder
(``PREFIX_CACHE_DIR``), one file per chunk of the prefill grid (``block``
tokens, ``PREFILL_CHUNK_TOKENS``), and a later request whose prompt starts
with stored chunks loads them instead of computing them, in any worker, after
any restart.

- What is stored: what the reuse mode would reuse from memory. In ``exact``
  mode, only chunks computed as a cold prompt alone computes them (on the
  grid: ``Sequence.exact_upto``), so that reading them answers bit for bit as
  computing them would. In ``on`` mode, every chunk of the prompt once in its
  row, each marked whether it was computed so (a prompt prefilled in time
  slices beside running requests is not): a request reading only marked
  chunks resumes on the grid and answers as a cold one; otherwise it may
  differ in the last bits, as reuse from memory does. The mode is part of the
  key. Answers' keys and values are not stored.
- Keys: a file is named by a hash chain over its prompt's tokens up to the end
  of its chunk, salted with :func:`store_key` (the graph file's identity, hence
  the model, its prepacking and its key/value type; the layout, the grid, the
  threads and the CPU), and with the LongRoPE regime. A changed model or
  setting never finds an old file; old files age out.
- Writing: the engine thread copies a finished chunk out of its row (a few
  milliseconds) into memory booked in the worker's key/value budget
  (:meth:`phi_api.engine.kv.budget.SharedBudget.stage`); a writer thread of the store writes it to a
  temporary file and renames it into place, so two workers writing the same
  chunk at once both leave a whole file. No room to stage, a full disk or no
  permission: the chunk is not stored, which is counted; no request fails.
- Reading: a file is memory-mapped, checked (size, header, CRC-32) and copied
  into the request's row. A file that fails a check is removed and counted;
  the request computes from there.
- Size: ``PREFIX_CACHE_DISK_MB`` bounds the folder, every model's files
  together. The least recently used leave first (a file's modification time
  is its last use; the chunks of one prompt share one time, and the deepest
  leave first, so a prompt's stored start stays usable longest).
"""

from __future__ import annotations

import collections
import hashlib
import itertools
import mmap
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from phi_api.engine.runtime.pool import KVPool
from phi_api.engine.runtime.spec import DecoderSpec
from phi_api.engine.threads.native import Signal, new_lock, start_thread

FORMAT = 2  # bump when the file layout or what goes into a key changes
SUFFIX = ".kv"
_HEADER = struct.Struct("<8sQQII")  # magic, tokens, payload bytes, CRC-32 of the payload, flags
_MAGIC = b"phikv\x00\x00\x02"
_EXACT = 1  # flag: computed as a cold prompt alone computes it (on the grid)
STAGING_BYTES = 64 * 2**20  # copies one engine may have waiting for the writer (at least one chunk's); more wait
RESCAN_SECONDS = 10.0  # how stale the writer's view of the folder's size may get (other workers write too)
STALE_TEMP_SECONDS = 600.0  # a temporary file this old was left by a process that died while writing


def store_key(identity: str, spec: DecoderSpec, block: int, threads: int, cpu: str, mode: str = "on") -> str:
    """The folder of one model's files: everything that changes the numbers a chunk's keys and values hold, and the
    reuse mode (``exact`` stores only exact chunks)."""
    layout = f"{spec.layers}x{spec.kv_heads}x{spec.kv_token_width}:{np.dtype(spec.kv_dtype).name}{spec.kv_layout}"
    text = f"format {FORMAT};{identity};{layout};block {block};threads {threads};{cpu};mode {mode}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass
class DiskStats:
    """What the store did, all told (read on the hub for /metrics; written by the engine and writer threads)."""

    tokens_read: int = 0
    tokens_written: int = 0
    write_failures: int = 0
    not_staged: int = 0  # chunks not stored (for now): the writer was behind, or the budget had no room
    corrupt: int = 0  # files that failed a check when read, removed
    bytes_on_disk: int = 0  # the whole folder, at the writer's last look
    last_error: str = ""
    load_seconds: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=1000))


class BlockLayout:
    """One chunk of ``block`` tokens of a pool's row, as a file holds it: ``[2, layers, kv_heads, block, head]``."""

    def __init__(self, spec: DecoderSpec, block: int) -> None:
        self.block = block
        self.shape = (2, spec.layers, spec.kv_heads, block, spec.kv_token_width)
        self.dtype = np.dtype(spec.kv_dtype)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize

    def gather(self, pool: KVPool, row: int, start: int) -> np.ndarray:
        """A copy of tokens ``[start, start + block)`` of ``row``."""
        out = np.empty(self.shape, dtype=self.dtype)
        for kind, buffers in enumerate((pool.keys, pool.values)):
            for layer, buffer in enumerate(buffers):
                out[kind, layer] = buffer[row, :, start:start + self.block]
        return out

    def scatter(self, data: np.ndarray, pool: KVPool, row: int, start: int) -> None:
        """Write a chunk read back into tokens ``[start, start + block)`` of ``row``."""
        for kind, buffers in enumerate((pool.keys, pool.values)):
            for layer, buffer in enumerate(buffers):
                buffer[row, :, start:start + self.block] = data[kind, layer]


def chain(prompt: np.ndarray, block: int, salt: str, count: int) -> list[str]:
    """The names of the first ``count`` chunks of ``prompt``: each hashes the one before it and its own tokens."""
    digest = hashlib.sha256(salt.encode())
    names = []
    for index in range(count):
        digest.update(np.ascontiguousarray(prompt[index * block:(index + 1) * block], dtype=np.int64).tobytes())
        names.append(f"{index:05d}-{digest.copy().hexdigest()[:40]}{SUFFIX}")
    return names


class PrefixStore:
    """One model's chunks in ``root / key``, within ``max_bytes`` for all of ``root``; see the module's docstring."""

    def __init__(self, root: Path, key: str, layout: BlockLayout, max_bytes: int, *,
                 stage: Callable[[int], bool], unstage: Callable[[int], None]) -> None:
        self.root = root
        self.folder = root / key
        self.layout = layout
        self.block = layout.block
        self.max_bytes = max_bytes
        self.stats = DiskStats()
        self._salt = key
        self._stage, self._unstage = stage, unstage
        self._queue: collections.deque[tuple[str, np.ndarray, int, int] | None] = collections.deque()
        self._queued = 0  # chunks staged, not yet written
        self._most_queued = max(1, STAGING_BYTES // layout.nbytes)
        self._lock = new_lock()
        self._signal = Signal()
        self._temp = itertools.count()
        self._written_since_scan = 0
        self._scanned_at = -RESCAN_SECONDS
        start_thread(self._write_loop, b"phi-api kv disk")

    # The engine thread's side -----------------------------------------------------------------------

    def names(self, prompt: np.ndarray, regime: str, count: int) -> list[str]:
        return chain(prompt, self.block, f"{self._salt};{regime}", count)

    def stored(self, prompt: np.ndarray, regime: str, most: int) -> int:
        """How many of ``prompt``'s first ``most`` chunks are stored, in a row from the first."""
        for index, name in enumerate(self.names(prompt, regime, most)):
            if not (self.folder / name).is_file():
                return index
        return most

    def load(self, pool: KVPool, row: int, prompt: np.ndarray, regime: str, count: int) -> tuple[int, int]:
        """Read ``prompt``'s first ``count`` chunks into ``row``; the tokens read (fewer when a file is missing or
        fails a check: it is removed), and how many of them lead computed as a cold prompt's."""
        started = time.perf_counter()
        names = self.names(prompt, regime, count)
        loaded, exact = 0, 0
        for index, name in enumerate(names):
            flags = self._read(self.folder / name, pool, row, index * self.block)
            if flags is None:
                break
            loaded += 1
            exact += exact == index and bool(flags & _EXACT)
        now = time.time_ns()
        for name in names[:loaded]:  # used now: one time for the chunks of one prompt (see _trim)
            _touch(self.folder / name, now)
        self.stats.tokens_read += loaded * self.block
        self.stats.load_seconds.append(time.perf_counter() - started)
        return loaded * self.block, exact * self.block

    def save(self, pool: KVPool, row: int, prompt: np.ndarray, regime: str, first: int, end: int, used_ns: int,
             exact_end: int = 0) -> int:
        """Store chunks ``[first, end)`` of ``prompt``, which ``row`` holds (those before ``exact_end`` computed as a
        cold prompt's), unless they are stored already; returns the first chunk that could not be staged now
        (``end``: none), from which a later call may go on."""
        for index, name in enumerate(self.names(prompt, regime, end)[first:], start=first):
            path = self.folder / name
            if path.is_file():
                _touch(path, used_ns)
                continue
            with self._lock:
                room = self._queued < self._most_queued and self._stage(self.layout.nbytes)
                self._queued += room
            if not room:
                self.stats.not_staged += 1
                return index  # the chunks after a missing one could never be loaded: not now either
            flags = _EXACT if index < exact_end else 0
            self._queue.append((name, self.layout.gather(pool, row, index * self.block), used_ns, flags))
            self._signal.set()
        return end

    @property
    def idle(self) -> bool:
        """Whether every staged chunk is written (or given up)."""
        with self._lock:
            return self._queued == 0

    def close(self) -> None:
        """The writer writes what is queued, then ends."""
        self._queue.append(None)
        self._signal.set()

    # The writer thread ------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        _lowest_priority()
        self._trim()  # the folder's size, for /metrics, from the start
        while True:
            while not self._queue:
                self._signal.wait(1.0)
            item = self._queue.popleft()
            if item is None:
                return
            name, data, used_ns, flags = item
            try:
                self._write(name, data, used_ns, flags)
            finally:
                with self._lock:
                    self._queued -= 1
                self._unstage(data.nbytes)
            del data
            self._trim()

    def _write(self, name: str, data: np.ndarray, used_ns: int, flags: int) -> None:
        path = self.folder / name
        temp = self.folder / f".tmp-{os.getpid()}-{id(self):x}-{next(self._temp)}"
        payload = memoryview(data.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # a key's prompts: the server's user's alone
            with os.fdopen(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as file:
                file.write(_HEADER.pack(_MAGIC, self.block, len(payload), zlib.crc32(payload), flags))
                file.write(payload)
            os.replace(temp, path)  # another worker's copy of the same chunk may land first: the same bytes
            _touch(path, used_ns)
        except OSError as error:
            self.stats.write_failures += 1
            self.stats.last_error = f"{type(error).__name__}: {error.strerror or error}"
            _remove(temp)
            return
        self.stats.tokens_written += self.block
        self._written_since_scan += _HEADER.size + len(payload)

    def _trim(self) -> None:
        """Keep the folder within its bound: least recently used files leave first, the deepest of a prompt first."""
        estimate = self.stats.bytes_on_disk + self._written_since_scan
        if estimate <= self.max_bytes and time.monotonic() - self._scanned_at < RESCAN_SECONDS:
            return
        files, total = _scan(self.root)
        self._scanned_at, self._written_since_scan = time.monotonic(), 0
        files.sort(key=lambda entry: (entry[0], -entry[1]))
        for _, _, size, path in files:
            if total <= self.max_bytes:
                break
            if _remove(path):
                total -= size
        self.stats.bytes_on_disk = total

    # Reading --------------------------------------------------------------------------------------------

    def _read(self, path: Path, pool: KVPool, row: int, start: int) -> int | None:
        """Copy one stored chunk into ``row`` at ``start``; its flags, or None (and the file removed if it is bad)
        if it cannot."""
        expected = _HEADER.size + self.layout.nbytes
        try:
            with open(path, "rb") as file:
                if os.fstat(file.fileno()).st_size != expected:
                    self._bad(path)
                    return None
                with mmap.mmap(file.fileno(), expected, prot=mmap.PROT_READ) as area:
                    magic, tokens, size, crc, flags = _HEADER.unpack_from(area)
                    view = memoryview(area)[_HEADER.size:]
                    try:
                        if (magic, tokens, size) != (_MAGIC, self.block, self.layout.nbytes) \
                                or zlib.crc32(view) != crc:
                            self._bad(path)
                            return None
                        data = np.frombuffer(view, dtype=self.layout.dtype).reshape(self.layout.shape)
                        self.layout.scatter(data, pool, row, start)
                        del data
                    finally:
                        view.release()
        except FileNotFoundError:  # evicted by a worker meanwhile
            return None
        except OSError:
            self._bad(path)
            return None
        return int(flags)

    def _bad(self, path: Path) -> None:
        self.stats.corrupt += 1
        _remove(path)


def _lowest_priority() -> None:
    """This thread yields the CPU to every other (nice 19): on a machine whose cores the engine's threads keep busy,
    writing waits for their idle moments rather than slowing a step."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (OSError, AttributeError):  # not Linux, or not allowed: the writer runs at the worker's priority
        pass


def _touch(path: Path, ns: int) -> None:
    try:
        os.utime(path, ns=(ns, ns))
    except OSError:  # evicted meanwhile
        pass


def _remove(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except OSError:
        return False


def _scan(root: Path) -> tuple[list[tuple[int, int, int, Path]], int]:
    """Every stored file under ``root`` as (last use, depth, size, path), and their total size; temporary files
    left by a process that died while writing are removed."""
    files, total = [], 0
    stale = time.time() - STALE_TEMP_SECONDS
    for folder in (entry for entry in _entries(root) if entry.is_dir(follow_symlinks=False)):
        for entry in _entries(Path(folder.path)):
            try:
                stat = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if entry.name.startswith(".tmp-"):
                if stat.st_mtime < stale:
                    _remove(Path(entry.path))
                continue
            if entry.name.endswith(SUFFIX):
                depth = int(entry.name[:5]) if entry.name[:5].isdigit() else 0
                files.append((stat.st_mtime_ns, depth, stat.st_size, Path(entry.path)))
                total += stat.st_size
    return files, total


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except OSError:
        return []
