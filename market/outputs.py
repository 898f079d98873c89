"""Job outputs kept by the market: the agent uploads each output file of an ended job, the
market checks it against the job's signed receipt and keeps it in Django's "outputs"
storage (a folder under GRIDBID_DATA_DIR, or S3 through django-storages) for its buyer,
until OUTPUTS_TTL_S has passed.

The receipt's signed `outputs_root` is a Merkle root over (path, size, SHA-256) of every
output file; the report that carries the receipt lists those files. An upload is taken
only when that list hashes to the signed root and names the path with the same SHA-256
and size as the bytes received, so what the buyer downloads is what the provider signed.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import IO, Any

from django.conf import settings
from django.core.files import File
from django.core.files.storage import Storage, storages
from django.db import IntegrityError, transaction
from django.utils import timezone

from contracts import receipts as receipt_format
from contracts.receipts import CHECKPOINT_OUTPUT
from market.errors import Conflict, DomainError, Gone, NotFound, TooLarge
from market.events import CheckpointKept, announce
from market.models import OUTPUT_PATH_MAX, Job, JobOutput, User
from providers.selectors import own_machine, provider_of

CHUNK = 1 << 20


def outputs_storage() -> Storage:
    return storages["outputs"]


def max_bytes() -> int:
    return int(settings.OUTPUTS_MAX_BYTES)


def ttl() -> timedelta:
    return timedelta(seconds=float(settings.OUTPUTS_TTL_S))


def output_path_check(path: str) -> str:
    """The path as the receipt names it, or DomainError saying what is wrong: relative,
    '/'-separated, no '.', '..' or empty segment, no backslash or control character,
    at most OUTPUT_PATH_MAX characters."""
    problem = None
    if not path:
        problem = "is empty"
    elif len(path) > OUTPUT_PATH_MAX:
        problem = f"is {len(path)} characters long; at most {OUTPUT_PATH_MAX}"
    elif path.startswith("/"):
        problem = "is absolute; give it relative to the job's output folder, as the receipt lists it"
    elif "\\" in path or any(ord(c) < 32 or ord(c) == 127 for c in path):
        problem = "holds a backslash or a control character"
    elif any(part in ("", ".", "..") for part in path.split("/")):
        problem = "has an empty, '.' or '..' segment; no path may leave the job's output folder"
    if problem:
        raise DomainError(f"The output path {problem}.", fields={"path": [f"The path {problem}."]})
    return path


def _receipt_outputs(job: Job) -> dict[str, dict[str, Any]]:
    """The job's output files by path, from its receipt report, once that list is proved to
    be the one the provider signed (it hashes to the receipt's outputs_root)."""
    held = (job.checkpoint or {}).get("receipt")
    if not held:
        raise Conflict(f"Job {job.pk} has no receipt yet; send the receipt first, then its outputs.")
    listed = held.get("outputs") or []
    try:
        files = [receipt_format.OutputFile(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in listed]
        root = receipt_format.outputs_root(files)
    except (KeyError, TypeError, ValueError):
        raise Conflict(f"The output list sent with job {job.pk}'s receipt is malformed; no outputs can be checked against it.") from None
    if root != held["body"]["outputs_root"]:
        raise Conflict(f"The output list sent with job {job.pk}'s receipt does not hash to its signed outputs_root; no outputs can be checked against it.")
    return {f.path: {"path": f.path, "size": f.size, "sha256": f.sha256} for f in files}


def _storage_name(job: Job, path: str) -> str:
    return f"jobs/{job.pk}/{path}"


@dataclass(frozen=True)
class Stored:
    output: JobOutput
    created: bool


def output_store(*, user: User, job_id: int, machine_id: int, path: str, body: IO[bytes], length: int) -> Stored:
    """Take one output file of a job from the agent of the machine that ran it.

    Refused: another provider's job or machine (404); a machine of this provider that did
    not run the job (409); no receipt yet (409); a path that is not in the receipt (400);
    over OUTPUTS_MAX_BYTES (413); bytes whose size or SHA-256 differ from the receipt's (400).
    Sending a file again that is already kept answers with it.
    """
    path = output_path_check(path)
    machine = own_machine(user, machine_id)
    job = Job.objects.filter(pk=job_id, trade__provider=provider_of(user)).select_related("trade__offer").first()
    if job is None:
        raise NotFound(f"No job {job_id} of yours.")
    if job.trade.offer.machine_id != machine.pk:
        raise Conflict(f"Job {job_id} ran on machine {job.trade.offer.machine_id}, not machine {machine.pk}; only its own machine's agent uploads its outputs.")
    expected = _receipt_checkpoint(job) if path == CHECKPOINT_OUTPUT else _receipt_outputs(job).get(path)
    if expected is None:
        raise DomainError(f"{path!r} is not among the outputs the receipt of job {job_id} lists.", fields={"path": ["Not in the receipt's outputs."]})
    limit = max_bytes()
    if expected["size"] > limit or length > limit:
        raise TooLarge(f"The file is larger than {limit:,} bytes, the most the market keeps per output file (OUTPUTS_MAX_BYTES).",
                       fields={"body": [f"At most {limit:,} bytes."]})
    if length != expected["size"]:
        raise DomainError(f"{path!r} is {length} bytes long (Content-Length); the receipt lists it with {expected['size']} bytes.",
                          fields={"Content-Length": [f"The receipt says {expected['size']}."]})
    held = JobOutput.objects.filter(job=job, path=path).first()
    if held is not None and held.sha256 == expected["sha256"]:
        _drain(body, limit)
        return Stored(held, False)
    with tempfile.TemporaryFile() as spool:
        digest, size = _copy_hashing(body, spool, limit)
        if size != expected["size"] or digest != expected["sha256"]:
            raise DomainError(
                f"{path!r} does not match the receipt: received {size} bytes with SHA-256 {digest}, the receipt lists {expected['size']} bytes with SHA-256 {expected['sha256']}.",
                fields={"sha256": ["Differs from the receipt's entry for this path."]},
            )
        spool.seek(0)
        store = outputs_storage()
        name = store.save(_storage_name(job, path), File(spool, name=path.rsplit("/", 1)[-1]))
    try:
        with transaction.atomic():
            output = JobOutput.objects.create(job=job, path=path, size=size, sha256=digest, storage_name=name, expires_at=timezone.now() + ttl())
            if path == CHECKPOINT_OUTPUT:
                announce(CheckpointKept(job_id=job.pk))  # the rest of the job may now resume from it
    except IntegrityError:  # the same file, sent twice at once: keep the first
        store.delete(name)
        return Stored(JobOutput.objects.get(job=job, path=path), False)
    return Stored(output, True)


def _receipt_checkpoint(job: Job) -> dict[str, Any] | None:
    """The checkpoint the job's receipt signs for, as an output entry; None without one."""
    held = (job.checkpoint or {}).get("receipt")
    if not held:
        raise Conflict(f"Job {job.pk} has no receipt yet; send the receipt first, then its checkpoint.")
    ck = (held.get("body") or {}).get("checkpoint")
    if not isinstance(ck, dict) or not ck.get("sha256"):
        return None
    return {"path": CHECKPOINT_OUTPUT, "size": int(ck.get("size") or 0), "sha256": str(ck["sha256"]).removeprefix("0x")}


def _copy_hashing(src: IO[bytes], dst: IO[bytes], limit: int) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    while chunk := src.read(CHUNK):
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"The file is larger than {limit:,} bytes, the most the market keeps per output file (OUTPUTS_MAX_BYTES).",
                           fields={"body": [f"At most {limit:,} bytes."]})
        h.update(chunk)
        dst.write(chunk)
    return h.hexdigest(), size


def _drain(src: IO[bytes], limit: int) -> None:
    read = 0
    while (chunk := src.read(CHUNK)) and read <= limit:
        read += len(chunk)


# --- the buyer's side -------------------------------------------------------------------------
def _buyers_job(user: User, job_id: int, *, operator: bool) -> Job:
    qs = Job.objects.filter(pk=job_id)
    if not operator:
        qs = qs.filter(trade__buyer=user)
    job: Job | None = qs.first()
    if job is None:
        raise NotFound(f"No job {job_id} of yours.")
    return job


@dataclass(frozen=True)
class OutputsView:
    job: Job
    files: list[JobOutput]
    waiting: list[dict[str, Any]]  # in the receipt, not uploaded (yet)
    expired_at: datetime | None


def outputs_of(*, user: User, job_id: int, operator: bool = False) -> OutputsView:
    """The job's kept output files, for its buyer (and operators); anyone else: not found."""
    job = _buyers_job(user, job_id, operator=operator)
    now = timezone.now()
    files = list(job.outputs.filter(expires_at__gt=now).order_by("path"))
    expired_at = _expired_at(job)
    have = {f.path for f in job.outputs.all()}
    listed = ((job.checkpoint or {}).get("receipt") or {}).get("outputs") or []
    waiting = [] if expired_at else [dict(f) for f in listed if isinstance(f, dict) and f.get("path") not in have]
    return OutputsView(job, files, waiting, expired_at)


def _expired_at(job: Job) -> datetime | None:
    raw = (job.checkpoint or {}).get("outputs_expired_at")
    return datetime.fromisoformat(raw) if raw else None


def output_open(*, user: User, job_id: int, path: str, operator: bool = False) -> tuple[JobOutput, IO[bytes]]:
    """One kept output file, opened for reading. 404 for anyone but its buyer (and operators)
    or a path the job does not have; 410 once it has expired. A preempted job's checkpoint
    is also for the provider whose machine runs the rest of the job from it."""
    # (a JSON key compared with a plain number: PostgreSQL has no jsonb = bigint for a subquery)
    trade_id = Job.objects.filter(pk=job_id).values_list("trade_id", flat=True).first() if path == CHECKPOINT_OUTPUT else None
    resuming = trade_id is not None and Job.objects.filter(trade__provider__user=user, trade__bid__resume_from__trade=trade_id).exists()
    job = _buyers_job(user, job_id, operator=operator or resuming)
    output = job.outputs.filter(path=path).first()
    gone = f"The outputs of job {job_id} were kept for {int(ttl().total_seconds())} s after upload (OUTPUTS_TTL_S) and have been deleted."
    if output is None:
        listed = {f.get("path") for f in ((job.checkpoint or {}).get("receipt") or {}).get("outputs") or [] if isinstance(f, dict)}
        if path in listed and _expired_at(job):
            raise Gone(gone)
        if path in listed:
            raise NotFound(f"The provider's agent has not uploaded {path!r} of job {job_id} yet; try again later.")
        raise NotFound(f"Job {job_id} has no output {path!r}.")
    if output.expires_at <= timezone.now():
        raise Gone(gone)
    return output, outputs_storage().open(output.storage_name, "rb")


def outputs_expire(*, now: datetime | None = None, limit: int = 500) -> int:
    """Delete the files and rows of outputs past their expiry; the job remembers when, so a
    download of one answers 410, not 404. Idempotent: a file already gone is skipped."""
    now = now or timezone.now()
    store = outputs_storage()
    deleted = 0
    for output_id, job_id, name in JobOutput.objects.filter(expires_at__lte=now).order_by("expires_at").values_list("id", "job_id", "storage_name")[:limit]:
        store.delete(name)  # first the file: a row left behind is retried, a file left behind is lost
        with transaction.atomic():
            if not JobOutput.objects.filter(pk=output_id).delete()[0]:
                continue
            job = Job.objects.select_for_update().get(pk=job_id)
            if not (job.checkpoint or {}).get("outputs_expired_at"):
                job.checkpoint = {**(job.checkpoint or {}), "outputs_expired_at": now.isoformat()}
                job.save(update_fields=["checkpoint", "updated_at"])
        deleted += 1
    return deleted
