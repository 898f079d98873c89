"""The runtime predictor in the market (issue 36): fitted on completed jobs, stored in the
database, read at quote and placement time. The model itself is market.runtime's.

A job's run time is what its agent's receipts say it used: its GPU-seconds (with those of
its extensions) over its GPUs; the wall-clock span between its start and end reports only
where a receipt counted none. Continuations of preempted jobs are left out: their run
time is a remainder, not a job's.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, IntegerField, OuterRef, Subquery, Sum
from django.db.models.functions import Coalesce

from market import runtime
from market.models import Job, RuntimeFit, RuntimeStat
from market.states import JobState

log = logging.getLogger(__name__)
KEEP_FITS = 3  # the latest fits kept; older ones (and their stats) are deleted by the refit


def runtime_records(*, limit: int) -> tuple[list[runtime.Record], int]:
    """The latest ``limit`` completed jobs as the model's records, and the highest job id
    among them (0 when there are none)."""
    ext = (
        Job.objects.filter(trade__extends=OuterRef("trade_id"))
        .values("trade__extends")
        .annotate(s=Sum("gpu_seconds"))
        .values("s")
    )
    rows = (
        Job.objects.filter(
            state=JobState.COMPLETED,
            trade__extends__isnull=True,
            trade__bid__resume_from__isnull=True,
        )
        .annotate(ext_gpu_s=Coalesce(Subquery(ext, output_field=IntegerField()), 0))
        .order_by(F("ended_at").desc(nulls_last=True), "-id")
        .values_list(
            "id",
            "gpu_seconds",
            "ext_gpu_s",
            "started_at",
            "ended_at",
            "trade__gpus",
            "trade__gpu_model_id",
            "trade__buyer_id",
            "trade__bid__job_spec",
        )[:limit]
    )
    records, last = [], 0
    for jid, gpu_s, ext_s, started, ended, gpus, model, buyer, spec in rows:
        last = max(last, jid)
        used = int(gpu_s or 0) + int(ext_s or 0)
        if used > 0:
            seconds = used / max(1, gpus)
        elif started is not None and ended is not None and ended >= started:
            seconds = (ended - started).total_seconds()
        else:
            continue  # a completion that reported neither: nothing to learn from
        records.append(
            runtime.Record(
                buyer=str(buyer),
                workload=workload_of(spec),
                gpus=int(gpus),
                model=str(model),
                runtime_s=seconds,
            )
        )
    records.reverse()  # oldest first: the order runtime.fit calibrates by
    return records, last


def workload_of(job_spec: Any) -> str:
    spec = job_spec if isinstance(job_spec, dict) else {}
    return runtime.workload(str(spec.get("image") or ""), spec.get("command"))


def runtime_fit(*, force: bool = False) -> RuntimeFit | None:
    """Fit the predictor on the latest RUNTIME_FIT_JOBS completed jobs and make it the one in
    use; None (nothing written) when no job completed since the last fit, unless ``force``."""
    records, last = runtime_records(limit=settings.CONFIG.runtime_fit_jobs)
    latest = RuntimeFit.objects.order_by("-id").first()
    if not force and latest is not None and latest.last_job == last and latest.jobs == len(records):
        return None
    model = runtime.fit(records)
    with transaction.atomic():
        fit = RuntimeFit.objects.create(jobs=len(records), last_job=last)
        RuntimeStat.objects.bulk_create(
            [RuntimeStat(fit=fit, level=lv, key=k, n=n, q=list(q)) for lv, k, n, q in model.rows()],
            batch_size=2000,
        )
        old = list(RuntimeFit.objects.order_by("-id").values_list("id", flat=True)[KEEP_FITS:])
        if old:
            RuntimeFit.objects.filter(id__in=old).delete()
    log.info("runtime predictor refitted on %d completed jobs (fit %d)", len(records), fit.pk)
    return fit


_cache: dict[str, Any] = {"fit": None, "model": None}


def runtime_model() -> runtime.Model | None:
    """The latest fit's model (read once per fit and process); None before the first fit."""
    latest = RuntimeFit.objects.order_by("-id").values_list("id", "fitted_at").first()
    if latest is None:
        return None
    if _cache["fit"] != latest:  # the time too: an id may come again after a rollback (SQLite)
        rows = RuntimeStat.objects.filter(fit_id=latest[0]).values_list("level", "key", "n", "q")
        _cache["model"], _cache["fit"] = runtime.Model.from_rows(rows), latest
    model: runtime.Model = _cache["model"]
    return model


def runtime_predict(
    *, buyer_id: int, job_spec: Any, gpus: int, gpu_models: list[str] | None, duration_s: int
) -> dict[str, Any] | None:
    """The prediction shown for a bid (``Prediction.as_dict``), capped at its booked duration;
    the GPU model counts only when the bid names exactly one. None: too few jobs yet."""
    model = runtime_model()
    if model is None:
        return None
    one = gpu_models[0] if gpu_models and len(gpu_models) == 1 else None
    got = model.predict(
        buyer=str(buyer_id),
        workload=workload_of(job_spec),
        gpus=int(gpus),
        model=one,
        cap_s=duration_s,
    )
    return None if got is None else got.as_dict()
