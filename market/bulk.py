"""Many rows' columns set to values of their own, in few statements.

Django's ``bulk_update`` writes ``SET col = CASE WHEN id = 1 THEN ... WHEN id = 2 THEN ...``,
and builds that expression in Python, row by row: at 10k bids a side, a round's bid updates
spent most of their time resolving its ``When`` objects, and PostgreSQL matched every row
against every ``WHEN``. On PostgreSQL ``rows_update`` sends
``UPDATE t SET col = v.col FROM (VALUES (id, value), ...) AS v WHERE t.id = v.id`` instead:
one join, each value cast to its column's type. Elsewhere (SQLite) it is ``bulk_update``.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection, models

BATCH = 200  # rows per statement on the fallback (bulk_update's CASE is quadratic in it)
VALUES_BATCH = 2000  # rows per UPDATE ... FROM (VALUES ...)


def rows_update(objs: Sequence[models.Model], fields: Sequence[str]) -> int:
    """Write ``fields`` of each of ``objs`` (instances of one model, with their primary
    keys) as they are on the instance; returns the rows updated. ``auto_now`` fields are
    not touched, as with ``bulk_update``."""
    if not objs:
        return 0
    model = type(objs[0])
    if connection.vendor != "postgresql":
        return model._default_manager.bulk_update(objs, list(fields), batch_size=BATCH)
    meta = model._meta
    pk = meta.pk
    assert pk is not None
    cols = [meta.get_field(f) for f in fields]
    qn = connection.ops.quote_name
    casts = [pk.db_type(connection)] + [f.db_type(connection) for f in cols]  # type: ignore[union-attr]
    row = "(" + ", ".join(f"%s::{c}" for c in casts) + ")"
    names = ", ".join(["pk"] + [f"c{i}" for i in range(len(cols))])
    sets = ", ".join(f"{qn(f.column)} = v.c{i}" for i, f in enumerate(cols))  # type: ignore[union-attr]
    done = 0
    with connection.cursor() as cur:
        for lo in range(0, len(objs), VALUES_BATCH):
            part = objs[lo:lo + VALUES_BATCH]
            params: list[object] = []
            for o in part:
                params.append(pk.get_db_prep_save(o.pk, connection))
                params.extend(f.get_db_prep_save(getattr(o, f.attname), connection) for f in cols)  # type: ignore[union-attr]
            cur.execute(f"UPDATE {qn(meta.db_table)} AS t SET {sets} FROM (VALUES {', '.join([row] * len(part))}) AS v({names}) "
                        f"WHERE t.{qn(pk.column)} = v.pk", params)
            done += cur.rowcount
    return done
