"""Query a CommInsight Parquet archive with DuckDB; print the results as one JSON object.

usage: archive_duckdb.py ARCHIVE_DIR
"""
import json
import sys

import duckdb

root = sys.argv[1]
src = f"read_parquet('{root}/parquet/**/*.parquet', hive_partitioning=true)"
con = duckdb.connect()


def rows(q):
    return [list(r) for r in con.sql(q).fetchall()]


out = {
    "per_comm": rows(
        f"select comm_hash, comm_name, count(*) from {src} "
        "where kind in ('coll','p2p') group by all order by all"
    ),
    "partitions": rows(
        f"select job::varchar, host::varchar, hour::varchar, count(*) from {src} group by all order by all"
    ),
    "rows": rows(f"select count(*) from {src}")[0][0],
    "dup_seq": rows(
        f"select count(*) from (select job, host, pid, seq from {src} "
        "group by all having count(*) > 1)"
    )[0][0],
    "kinds": rows(f"select kind, count(*) from {src} group by all order by all"),
    "misaligned": rows(
        f"select count(*) from {src} where start_ns is not null "
        "and (aligned_start_ns::hugeint - start_ns::hugeint) <> "
        "(select min(aligned_start_ns::hugeint - start_ns::hugeint) from " + src + ")"
    )[0][0],
    "clock_err": rows(f"select distinct clock_err_ns from {src}"),
    "overdue_json": rows(
        f"select json_extract_string(body_json, '$.age_ms') from {src} where kind = 'overdue' order by all"
    ),
    "gpu_misaligned": rows(
        f"select count(*) from {src} where kind in ('coll','p2p') and "
        "(aligned_gpu_start_ns::hugeint - gpu_start_ns::hugeint <> 1795000000000000000 "
        "or aligned_gpu_end_ns::hugeint - gpu_end_ns::hugeint <> 1795000000000000000 "
        "or aligned_gpu_start_ns is null)"
    )[0][0],
    "gpu_err": rows(
        f"select distinct gpu_clock_err_ns from {src} where kind in ('coll','p2p')"
    ),
    "op_json": rows(
        f"select count(*) from {src} where kind in ('coll','p2p') and body_json is not null"
    )[0][0],
    "non_op_without_json": rows(
        f"select count(*) from {src} where kind not in ('coll','p2p') and body_json is null"
    )[0][0],
    "op_fields": rows(
        f"select sum(api_ns), sum(nwarps), sum(channels_done) from {src} where kind in ('coll','p2p')"
    )[0],
    "columns": [r[0] for r in con.sql(f"describe select * from {src}").fetchall()],
}
print(json.dumps(out))
