"""Downloading weights into the cache, once, verified, and never leaving a torn file.

    path = fetch("https://download.pytorch.org/models/resnet50-0676ba61.pth",
                 checksum=Checksum("sha256", "0676ba61"))

Where files go: ``$DETCORE_CACHE/weights/<host>/<path of the URL>`` (``$DETCORE_CACHE`` defaults
to ``~/.cache/detcore``), e.g. ``~/.cache/detcore/weights/download.pytorch.org/models/resnet50-0676ba61.pth``.
A file placed there by hand is used as if downloaded (after the same checks): that is how an
offline machine gets its weights, and every error says which path it is.

How a file gets there:

* One process at a time per file: a lock file beside it (``<file>.lock``, ``fcntl.flock``)
  makes the other processes of the machine, the other ranks of a run among them, wait and then
  find the finished file. Machines sharing the cache folder over a network file system are
  covered when it supports locks (NFSv4, Lustre mounted with flock); model_zoo.resolve_weights
  adds the torch.distributed barrier for the ranks of one run.
* The bytes go to ``<file>.part``; a transfer cut in the middle is retried (``RETRIES`` times,
  waiting ``BACKOFF_SECONDS`` times the attempt), resuming with an HTTP Range request where the
  server allows it. Only a complete file that passes its checks is renamed to its final name.
* Checks: the publisher's checksum when there is one (a sha256 or md5 hex prefix); the caller's
  own check otherwise (model_zoo checks the layout); then the file's full sha256 is recorded in
  ``<file>.sha256``. Every later use compares the file with that record (and the publisher's
  checksum), so a cached file changed since (a disk error, a copy cut short) is moved aside to
  ``<file>.corrupt`` and downloaded again, never loaded.
"""
import contextlib
import hashlib
import http.client
import logging
import os
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional

from detcore.utils.cache import get_cache_dir

from .catalog import Checksum

__all__ = ["DownloadError", "MIRROR_ENV", "cache_path", "fetch", "file_digests", "mirrored", "weights_cache_dir"]

logger = logging.getLogger(__name__)

MIRROR_ENV = "DETCORE_WEIGHTS_MIRROR"
RETRIES = 3            # attempts after the first, for errors that may pass (cut, refused, 5xx)
BACKOFF_SECONDS = 2.0  # wait before attempt k: k times this
TIMEOUT_SECONDS = 60   # a connection or a read that stalls this long fails the attempt
_CHUNK = 1 << 20
_PERMANENT_HTTP = (400, 401, 403, 404, 405, 410, 451)  # asking again gives the same answer


class DownloadError(RuntimeError):
    """A file that could not be downloaded or verified; the message names the URL and the path
    where a file placed by hand is used."""


def weights_cache_dir() -> Path:
    """``$DETCORE_CACHE/weights`` (``~/.cache/detcore/weights`` by default)."""
    return Path(get_cache_dir()) / "weights"


def cache_path(url: str) -> Path:
    """Where the file of ``url`` is cached: ``weights/<host>/<url path>`` (query and fragment are
    not part of it). The same file is found whatever mirror it came from: pass the publisher's URL."""
    parts = urllib.parse.urlsplit(url)
    segments = [urllib.parse.unquote(s) for s in parts.path.split("/") if s]
    if not parts.hostname or not segments or any(s in (".", "..") or os.sep in s for s in segments):
        raise ValueError(f"cannot cache {url!r}: a weights URL must name a host and a file path")
    host = parts.hostname + (f"_{parts.port}" if parts.port else "")
    return weights_cache_dir().joinpath(host, *segments)


def mirrored(url: str) -> str:
    """``url`` with its scheme and host replaced by ``$DETCORE_WEIGHTS_MIRROR`` (``http://HOST:PORT``,
    optionally with a path prefix), keeping the path; ``url`` itself when the variable is unset."""
    mirror = os.environ.get(MIRROR_ENV, "").strip()
    if not mirror:
        return url
    m = urllib.parse.urlsplit(mirror)
    if m.scheme not in ("http", "https") or not m.netloc or m.query or m.fragment:
        raise ValueError(f"{MIRROR_ENV} must be http://HOST[:PORT][/PREFIX] or https://..., got {mirror!r}")
    u = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit((m.scheme, m.netloc, m.path.rstrip("/") + u.path, u.query, ""))


def file_digests(path, algorithms=("sha256",)) -> Dict[str, str]:
    """Hex digests of the file at ``path``, one read for all ``algorithms``."""
    hashes = {a: hashlib.new(a) for a in algorithms}
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            for h in hashes.values():
                h.update(block)
    return {a: h.hexdigest() for a, h in hashes.items()}


# --- one process per file -------------------------------------------------------------------------
@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock_path = path.with_name(path.name + ".lock")
    with open(lock_path, "a+b") as f:
        if not _try_lock(f):
            logger.info("Waiting for %s: another process is downloading it (lock %s)", path.name, lock_path)
            while not _try_lock(f):
                time.sleep(0.2)
        try:
            yield
        finally:
            _unlock(f)


try:
    import fcntl

    def _try_lock(f) -> bool:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def _unlock(f) -> None:
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)

except ImportError:  # Windows: a lock on the file's first byte
    import msvcrt

    def _try_lock(f) -> bool:
        f.seek(0)
        try:
            msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False

    def _unlock(f) -> None:
        f.seek(0)
        msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)


# --- verification ---------------------------------------------------------------------------------
def _record_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _problem(path: Path, checksum: Optional[Checksum], check: Optional[Callable[[Path], None]], recorded: Optional[str]) -> Optional[str]:
    """Why the file at ``path`` must not be used (None when it may): its sha256 differs from
    ``recorded``, its digest from ``checksum``, or ``check`` raises."""
    algorithms = ["sha256"] + ([checksum.algorithm] if checksum is not None and checksum.algorithm != "sha256" else [])
    digests = file_digests(path, algorithms)
    if recorded is not None and digests["sha256"] != recorded:
        return f"its sha256 {digests['sha256']} differs from the {recorded} recorded when it was downloaded"
    if checksum is not None and not checksum.matches(digests[checksum.algorithm]):
        return f"its {checksum.algorithm} is {digests[checksum.algorithm]}, the publisher's starts with {checksum.prefix}"
    if recorded is None and check is not None:
        try:
            check(path)
        except Exception as e:  # the caller's check says what is wrong in its own words
            return str(e)
    return None


def _read_record(path: Path) -> Optional[str]:
    try:
        text = _record_path(path).read_text().split()
    except (OSError, UnicodeDecodeError):
        return None
    return text[0].lower() if text and len(text[0]) == 64 else None


def _write_record(path: Path, sha256: str) -> None:
    tmp = _record_path(path).with_name(_record_path(path).name + ".tmp")
    tmp.write_text(f"{sha256}  {path.name}\n")
    os.replace(tmp, _record_path(path))


# --- the transfer ---------------------------------------------------------------------------------
class _Retry(Exception):
    """An attempt that failed in a way a later one may not."""


def _progress(total: Optional[int], start: int, name: str):
    """A callable taking the bytes written so far, and a closer: tqdm on a terminal when installed,
    a line to stderr per 10% otherwise (and log lines when stderr is no terminal)."""
    if sys.stderr.isatty():
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        if tqdm is not None:
            bar = tqdm(total=total, initial=start, unit="B", unit_scale=True, unit_divisor=1024, desc=name)
            last = [start]

            def update(done):
                bar.update(done - last[0])
                last[0] = done

            return update, bar.close
    step = max(total // 10 if total else 50 * _CHUNK, _CHUNK)
    mark = [start + step]

    def report(done):
        if done >= mark[0]:
            shown = f"{done / 2**20:.1f} of {total / 2**20:.1f} MiB" if total else f"{done / 2**20:.1f} MiB"
            logger.info("Downloading %s: %s", name, shown)
            mark[0] = done + step

    return report, lambda: None


def _attempt(url: str, part: Path, show_progress: bool) -> None:
    """One GET of ``url`` into ``part``, resuming after the bytes already there when the server
    allows; raises _Retry for errors worth another attempt, DownloadError for the others."""
    start = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": "detcore-weights/1"}
    if start:
        headers["Range"] = f"bytes={start}-"
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT_SECONDS)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 416 and start:  # the partial file is not a prefix of this one: start over
            part.unlink()
            raise _Retry(f"HTTP 416 for a resumed download; starting over") from None
        if e.code in _PERMANENT_HTTP:
            raise DownloadError(f"HTTP {e.code} {e.reason}") from None
        raise _Retry(f"HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        reason = getattr(e, "reason", e)
        raise _Retry(f"{type(reason).__name__}: {reason}") from None
    with response:
        if start and response.status == 206 and response.headers.get("Content-Range", "").startswith(f"bytes {start}-"):
            mode = "ab"
        else:
            start, mode = 0, "wb"  # the server sends the whole file
        length = response.headers.get("Content-Length")
        total = start + int(length) if length and length.isdigit() else None
        update, close = _progress(total, start, part.name[: -len(".part")]) if show_progress else (lambda d: None, lambda: None)
        done = start
        try:
            with open(part, mode) as f:
                while True:
                    block = response.read(_CHUNK)
                    if not block:
                        break
                    f.write(block)
                    done += len(block)
                    update(done)
                f.flush()
                os.fsync(f.fileno())
        except (OSError, http.client.HTTPException) as e:  # a cut connection, a stalled read
            raise _Retry(f"transfer cut after {done} of {total or '?'} bytes ({type(e).__name__}: {e})") from None
        finally:
            close()
    if total is not None and done < total:
        raise _Retry(f"transfer cut after {done} of {total} bytes")


def _download(url: str, part: Path, show_progress: bool) -> None:
    errors = []
    for attempt in range(RETRIES + 1):
        if attempt:
            delay = BACKOFF_SECONDS * attempt
            logger.warning("Download of %s failed (%s); attempt %d of %d in %.0f s", url, errors[-1], attempt + 1, RETRIES + 1, delay)
            time.sleep(delay)
        try:
            _attempt(url, part, show_progress)
            return
        except _Retry as e:
            errors.append(str(e))
    raise DownloadError(f"{len(errors)} attempts failed, the last with {errors[-1]}")


def _unusable(path: Path, reason: str) -> None:
    aside = path.with_name(path.name + ".corrupt")
    os.replace(path, aside)
    _record_path(path).unlink(missing_ok=True)
    logger.warning("Cached weights %s are not usable (%s): moved to %s, downloading again", path, reason, aside)


def fetch(
    url: str,
    *,
    checksum: Optional[Checksum] = None,
    check: Optional[Callable[[Path], None]] = None,
    cache_url: Optional[str] = None,
    progress: bool = True,
) -> Path:
    """The cached file of ``url``, downloaded first if needed (see the module docstring).

    Args:
        url: where to download it from (a mirror's URL, say).
        checksum: the publisher's checksum, checked on every use.
        check: called with the path of a file that has no recorded sha256 yet (just downloaded,
            or placed by hand); raises to refuse it. For files without a published checksum.
        cache_url: the URL that names the file in the cache (the publisher's; default ``url``).
        progress: show the download's progress.
    """
    dest = cache_path(cache_url or url)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _locked(dest):
        if dest.exists():
            recorded = _read_record(dest)
            problem = _problem(dest, checksum, check, recorded)
            if problem is None:
                if recorded is None:
                    _write_record(dest, file_digests(dest)["sha256"])
                return dest
            _unusable(dest, problem)
        part = dest.with_name(dest.name + ".part")
        source = url if not cache_url or cache_url == url else f"{url} (a mirror of {cache_url})"
        hint = _manual_hint(cache_url or url, dest, checksum)
        # A .part left by an earlier process is resumed; if the whole then fails its checks, that
        # start may belong to another version of the file: once more from nothing.
        for fresh in ((False, True) if part.exists() else (True,)):
            if fresh and part.exists():
                logger.warning("%s, resumed from an earlier partial download, failed its checks (%s); downloading it whole", url, problem)
                part.unlink()
            try:
                _download(url, part, progress)
            except DownloadError as e:
                raise DownloadError(f"Could not download {source}: {e}.{hint}") from None
            problem = _problem(part, checksum, check, None)
            if problem is None:
                break
        if problem is not None:
            part.unlink()
            raise DownloadError(f"Downloaded {source}, but it is not the file expected: {problem}. It was removed.{hint}")
        _write_record(dest, file_digests(part)["sha256"])
        os.replace(part, dest)
        logger.info("Downloaded %s to %s", url, dest)
    return dest


def _manual_hint(url: str, dest: Path, checksum: Optional[Checksum]) -> str:
    verified = f" after checking its {checksum}" if checksum is not None else ""
    return (
        f"\nTo use it offline, download {url} elsewhere and place it at\n    {dest}\n"
        f"(it is used from there{verified}); or set {MIRROR_ENV}=http://HOST:PORT to fetch catalog "
        "weights from a mirror serving the same paths; or give a file's path as MODEL.WEIGHTS."
    )
