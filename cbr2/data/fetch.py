"""``python -m cbr2.data fetch kqapro|metaqa DIR``: the public datasets, downloaded, verified and laid out.

``SOURCES`` is the one table of where each dataset comes from and what can be verified of it.
A download goes to ``<file>.part`` beside its destination and resumes from there (an HTTP
``Range`` request) when the command runs again after a broken connection; the file takes its
name only once it is whole and verified. After the files are in place, the folder goes through
``cbr2.data.check`` like any other.

When no source can be reached the command fails in one line that names the URLs tried and
the steps to do by hand.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import shutil
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.error import HTTPError, URLError
from urllib.request import Request, urlopen

from cbr2.common.console import progress
from cbr2.common.errors import SetupError
from cbr2.data.check import kqapro_files, metaqa_files

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
TIMEOUT_S = 60
"""Seconds a connection may stay silent before the download counts as broken."""

HF_MIRROR_REVISION = "0b26da66cec9a4d1e42bde3560aeae9f89f6433b"
"""The pinned revision of ``drt/kqa_pro`` whose files the digests below are of."""


@dataclass(frozen=True)
class Source:
    """One place a dataset can be downloaded from.

    Attributes:
        dataset: ``kqapro`` or ``metaqa``.
        name: What ``--source`` calls it.
        url: A zip's URL (``archive``), or the base URL the files' paths are appended to;
            None where nothing can be downloaded without a browser.
        files: What it lays out in the folder, as paths relative to it (and to ``url``).
        archive: ``url`` is a zip holding ``files`` in one folder.
        sha256: Known digests, by file.
        page: Where a person finds the data.
        verified: What ``fetch`` verifies of it, in words (docs/data.md shows the table).
    """

    dataset: str
    name: str
    url: str | None
    files: tuple[str, ...]
    archive: bool = False
    sha256: Mapping[str, str] = field(default_factory=dict)
    page: str = ""
    verified: str = ""


SOURCES: dict[str, tuple[Source, ...]] = {
    "kqapro": (
        Source("kqapro", "release", "https://cloud.tsinghua.edu.cn/f/26d05edaa5d0480bb3ae/?dl=1", tuple(kqapro_files()),
               archive=True, page="https://github.com/shijx12/KQAPro_Baselines (its README links the zip)",
               verified="a zip (every member's CRC) holding the four files in one folder; no published digest"),
        Source("kqapro", "mirror", f"https://huggingface.co/datasets/drt/kqa_pro/resolve/{HF_MIRROR_REVISION}/",
               tuple(kqapro_files()), page="https://huggingface.co/datasets/drt/kqa_pro",
               # The digests of the pinned revision, as its LFS object ids give them (recorded by
               # public audits of the mirror; the maintainers publish none). kb.json: newer schema.
               sha256={
                   "kb.json": "04da7408320c5cb7023c44372cce32846d56d369d8865d2e61a18c3956661a7c",
                   "train.json": "e9fbe4c1cdf207aac83ae0d5e4a1a53a9965a2b13b403de699ca6d5dae6e4510",
                   "val.json": "b4aed6ab3d7ad071722064fe3bb02bc028cfbeb15da5f7115d57a1e2d198f3bb",
                   "test.json": "b2142ed6124ae525b7d7fd8d1edb338c1b025751ac0167ff1498608111911822",
               },
               verified="sha256 of each file (pinned revision)"),
    ),
    "metaqa": (
        # The release is a Google Drive folder, reported unreachable (MetaQA issue #1); it cannot
        # be downloaded without a browser, so only --url (a copy in the release's layout) fetches.
        Source("metaqa", "release", None, tuple(metaqa_files()),
               page="https://drive.google.com/drive/folders/0B-36Uca2AvwhTWVFSUZqRXVtbUE (linked from "
                    "https://github.com/yuyuz/MetaQA)",
               verified="no published digest; with --url, each file arrives whole"),
    ),
}
"""Dataset → its sources, in the order ``fetch`` tries them."""

MANUAL = {
    "kqapro": ("download the zip {release_url} (or the four files of {mirror_page}, revision "
               f"{HF_MIRROR_REVISION[:7]}), put kb.json, train.json, val.json and test.json in {{dir}}, then run "
               "python -m cbr2.data check {dir}"),
    "metaqa": ("download the MetaQA folder from {release_page} (reported broken: MetaQA issue #1), put kb.txt, "
               "{{1,2,3}}-hop/vanilla/qa_{{train,dev,test}}.txt and {{1,2,3}}-hop/qa_{{train,dev,test}}_qtype.txt in "
               "{dir} (or pass --url BASE, a copy in that layout), then run python -m cbr2.data check {dir}"),
}
"""The steps by hand, per dataset, for the one-line error."""


class FetchError(SetupError):
    """A download that failed: unreachable, refused, broken off, or not what the source holds."""


class BrokenDownload(FetchError):
    """A connection that broke off: the part file stays, and the next run resumes it from the same source."""


def _manual(dataset: str, root: Path) -> str:
    where = {f"{s.name}_{what}": getattr(s, what) for s in SOURCES[dataset] for what in ("url", "page")}
    return MANUAL[dataset].format(dir=root, **where)


def sha256_of(path: Path) -> str:
    """The hex sha256 of a file."""
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def download(url: str, dest: Path, sha256: str | None = None, desc: str | None = None) -> Path:
    """Download ``url`` to ``dest`` through ``dest.part``, resuming a part left by a broken run.

    A part file is continued with ``Range: bytes=N-``; a server that answers with the whole
    file instead (200) starts it over, and one that answers 416 is taken to say the part is
    already whole. ``dest`` appears only when the download is complete (as long as the server's
    ``Content-Length`` says) and its digest, when known, matches.

    Args:
        url: What to download.
        dest: Where the file goes.
        sha256: Its expected digest, or None.
        desc: What the progress display calls it (default: the file's name).

    Returns:
        ``dest``.

    Raises:
        FetchError: Unreachable, an HTTP error, a connection broken off (the part file stays,
            for the next run to resume), or a digest that does not match (the part is deleted).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": "cbr2-data-fetch", **({"Range": f"bytes={have}-"} if have else {})}
    try:
        response = urlopen(Request(url, headers=headers), timeout=TIMEOUT_S)
    except HTTPError as err:
        if not (err.code == 416 and have):
            raise FetchError(f"{url}: HTTP {err.code} {err.reason}") from None
        response = None  # nothing left to send: the part is whole
    except (URLError, OSError) as err:
        raise FetchError(f"{url}: {getattr(err, 'reason', err)}") from None
    if response is not None:
        with response:
            start = have if response.status == 206 and _range_start(response) == have else 0
            length = response.headers.get("Content-Length")
            total = start + int(length) if length is not None else None
            got = 0
            with part.open("ab" if start else "wb") as sink, \
                    progress(total, desc=desc or dest.name, unit="B", initial=start, unit_scale=True) as bar:
                try:
                    while chunk := response.read(CHUNK_BYTES):
                        sink.write(chunk)
                        got += len(chunk)
                        bar.update(len(chunk))
                except (OSError, http.client.HTTPException):
                    pass  # said below, with what arrived
            if total is not None and start + got < total:
                raise BrokenDownload(f"{url}: the connection broke off after {start + got:,} of {total:,} bytes; "
                                 f"{part} is kept: run the same command again to resume")
    if sha256 is not None and (actual := sha256_of(part)) != sha256:
        part.unlink()
        raise FetchError(f"{url}: sha256 {actual}, expected {sha256} (the download is deleted; run again)")
    part.replace(dest)
    return dest


def _range_start(response: http.client.HTTPResponse) -> int | None:
    """Where a 206's ``Content-Range: bytes START-END/TOTAL`` starts, or None."""
    value = response.headers.get("Content-Range", "")
    unit, _, spec = value.partition(" ")
    first = spec.partition("-")[0]
    return int(first) if unit == "bytes" and first.isdigit() else None


def _have(root: Path, source: Source) -> bool:
    """Whether every file of ``source`` is already in place (and matches its digest, when known)."""
    return all((root / f).is_file() and (f not in source.sha256 or sha256_of(root / f) == source.sha256[f])
               for f in source.files)


def _fetch_files(source: Source, url: str, root: Path) -> None:
    base = url if url.endswith("/") else url + "/"
    for name in source.files:
        dest = root / name
        if dest.is_file() and (name not in source.sha256 or sha256_of(dest) == source.sha256[name]):
            continue  # fetched by an earlier run
        download(base + name, dest, source.sha256.get(name), desc=name)


def _fetch_archive(source: Source, url: str, root: Path) -> None:
    archive = download(url, root / f".{source.dataset}-{source.name}.zip", source.sha256.get("archive"),
                       desc=f"{source.dataset} {source.name} zip")
    try:
        with zipfile.ZipFile(archive) as zf:
            if (bad := zf.testzip()) is not None:
                raise FetchError(f"{url}: {bad}: corrupt in the archive (CRC mismatch); the download is deleted")
            members = {Path(info.filename): info for info in zf.infolist() if not info.is_dir()}
            folders = {m.parent for m in members if m.name == source.files[0]}
            folder = next((f for f in sorted(folders) if all(f / n in members for n in source.files)), None)
            if folder is None:
                raise FetchError(f"{url}: the archive has no folder holding {', '.join(source.files)}")
            for name in source.files:
                with zf.open(members[folder / name]) as src, (root / name).open("wb") as sink:
                    shutil.copyfileobj(src, sink, CHUNK_BYTES)
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:  # not a zip (an HTML error page, say), or corrupt
        raise FetchError(f"{url}: not a readable zip archive ({err}); the download is deleted") from None
    finally:
        archive.unlink()  # unpacked, or refused: a rerun downloads it again


def fetch(dataset: str, root: str | Path, source: str | None = None, url: str | None = None) -> Source:
    """Download a dataset into ``root`` in the layout ``data.root`` expects, from the first source that serves it.

    Args:
        dataset: ``kqapro`` or ``metaqa``.
        root: The folder (created if needed).
        source: One of ``SOURCES[dataset]`` by name; default: each in turn.
        url: Instead of the source's URL (a mirror, a local server): a zip's URL for an
            archive source, else the base URL of the files.

    Returns:
        The source the files came from.

    Raises:
        FetchError: When no source served the files: one line naming each URL tried and why,
            and the steps to do by hand.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    candidates = [s for s in SOURCES[dataset] if source is None or s.name == source]
    if not candidates:
        raise FetchError(f"unknown --source {source!r} for {dataset}; expected one of "
                         f"{', '.join(s.name for s in SOURCES[dataset])}")
    if url is not None and len(candidates) > 1:
        wants = "; ".join(f"{s.name}: {'the URL of its zip' if s.archive else 'the base URL of its files'}"
                          for s in candidates)
        raise FetchError(f"--url needs --source ({wants})")
    failures = []
    for candidate in candidates:
        where = url or candidate.url
        if _have(root, candidate):
            log.info("%s: every file of %s is already in place", root, candidate.name)
            return candidate
        if where is None:
            failures.append(f"{candidate.name}: no direct download")
            continue
        try:
            (_fetch_archive if candidate.archive else _fetch_files)(candidate, where, root)
            return candidate
        except BrokenDownload:
            raise  # resumed from this source by the next run, not started over from another
        except FetchError as err:
            failures.append(f"{candidate.name}: {err}")
    raise FetchError(f"cannot fetch {dataset}: {'; '.join(failures)}. By hand: {_manual(dataset, root)}")
