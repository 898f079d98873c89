"""Job inputs: downloaded into the job's directory and checked against their SHA-256."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from contracts.receipts import file_sha256
from providers.agent.runtime import inside


class InputError(Exception):
    pass


def _name(url: str) -> str:
    name = Path(unquote(urlparse(url).path)).name
    return name or "input"


def fetch_inputs(inputs: Sequence[dict[str, Any]], dest: Path, *, progress: Any = None, timeout_s: float = 60.0,
                 headers: dict[str, str] | None = None) -> list[Path]:
    """Download each {url, sha256, path?} under `dest`; a digest mismatch deletes the file and raises.

    `progress` is an optional rich Progress; http(s) and file URLs are accepted. `headers`
    go with each http(s) request: only pass credentials for URLs of their own server.
    """
    out = []
    for item in inputs:
        url, want = item["url"], str(item["sha256"]).lower()
        target = inside(dest, item.get("path") or _name(url))
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() and file_sha256(target) == want:
            out.append(target)  # already here from an earlier attempt
            continue
        tmp = target.with_name(f".{target.name}.part")
        h = hashlib.sha256()
        task = progress.add_task(f"input {target.name}", total=None) if progress is not None else None
        try:
            scheme = urlparse(url).scheme
            if scheme == "file":
                with open(unquote(urlparse(url).path), "rb") as src, open(tmp, "wb") as dst:
                    for chunk in iter(lambda: src.read(1 << 20), b""):
                        h.update(chunk)
                        dst.write(chunk)
                        if task is not None:
                            progress.advance(task, len(chunk))
            elif scheme in ("http", "https"):
                import httpx

                with httpx.stream("GET", url, timeout=timeout_s, follow_redirects=not headers, headers=headers) as r:
                    if r.status_code != 200:
                        raise InputError(f"input {url}: HTTP {r.status_code}")
                    if task is not None and r.headers.get("content-length"):
                        progress.update(task, total=int(r.headers["content-length"]))
                    with open(tmp, "wb") as dst:
                        for chunk in r.iter_bytes(1 << 20):
                            h.update(chunk)
                            dst.write(chunk)
                            if task is not None:
                                progress.advance(task, len(chunk))
            else:
                raise InputError(f"input {url}: only http, https and file URLs are supported")
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise InputError(f"input {url}: {exc}") from exc
        except Exception:
            tmp.unlink(missing_ok=True)
            raise
        if h.hexdigest() != want:
            tmp.unlink(missing_ok=True)
            raise InputError(f"input {url}: sha256 is {h.hexdigest()}, the job spec says {want}")
        os.replace(tmp, target)
        out.append(target)
    return out


def pack_checkpoint(src: Path, archive: Path) -> dict[str, Any] | None:
    """Tar the checkpoint directory; {size, sha256, path} or None when it is empty."""
    import tarfile

    if not src.is_dir() or not any(src.iterdir()):
        return None
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w") as tar:
        for p in sorted(src.rglob("*")):
            if p.is_file() and not p.is_symlink():
                info = tar.gettarinfo(str(p), arcname=p.relative_to(src).as_posix())
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                with open(p, "rb") as f:
                    tar.addfile(info, f)
    return {"size": archive.stat().st_size, "sha256": file_sha256(archive), "url": archive.resolve().as_uri()}


def unpack_checkpoint(archive: Path, dest: Path) -> None:
    import tarfile

    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")


def copy_outputs(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, dirs_exist_ok=True)


class UploadError(Exception):
    pass


def upload_url(base: str, trade_id: int, name: str) -> str:
    """Where an archive of a trade goes under the job's `upload_url` folder."""
    return f"{base.rstrip('/')}/trade-{trade_id}/{name}"


def upload_archive(archive: dict[str, Any], url: str, *, attempts: int = 4, timeout_s: float = 120.0) -> dict[str, Any]:
    """PUT a packed archive ({size, sha256, url: file://...}) to `url` (http or https), with its
    digest in `X-Content-SHA256`; retried with backoff on transport errors and 5xx. Returns
    the archive's description with `url` now the uploaded location."""
    import time

    import httpx

    if urlparse(url).scheme not in ("http", "https"):
        raise UploadError(f"upload_url must be http or https, not {url!r}")
    path = Path(unquote(urlparse(archive["url"]).path))
    last = ""
    for attempt in range(attempts):
        try:
            with open(path, "rb") as body:
                r = httpx.put(url, content=body, timeout=timeout_s,
                              headers={"Content-Type": "application/x-tar", "X-Content-SHA256": archive["sha256"], "Content-Length": str(archive["size"])})
            if r.status_code < 300:
                return {**archive, "url": url}
            last = f"the store answered {r.status_code}"
            if r.status_code < 500:
                break  # refused: retrying will not help
        except httpx.HTTPError as exc:
            last = str(exc)
        time.sleep(min(8.0, 0.5 * 2**attempt))
    raise UploadError(f"upload to {url} failed: {last}")
