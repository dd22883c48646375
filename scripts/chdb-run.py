"""Run ClickHouse statements and queries on chdb (ClickHouse 26.x in-process).

The Go tests that check the migrations and the documented queries on a
second ClickHouse version (sink/analyst_versions_test.go) run this with the
python of scripts/chdb-venv.sh. It reads one JSON object on stdin:

    {"path": "<session dir>", "database": "<name>",
     "statements": ["CREATE ...", ...], "queries": ["SELECT ...", ...]}

creates the database, runs the statements in order with it as the current
database, then each query, and writes one JSON object on stdout:

    {"version": "26.9.2.1", "results": ["<TabSeparated output>", ...]}

or, when a statement or query fails, {"error": "...", "sql": "..."} with
exit status 1. The server's time zone is UTC, as the test server's is
(deploy/local/clickhouse.sh): that is the one setting the two versions
need alike that is not in the SQL. The tests of the time-zone check set
another in METERLINE_CHDB_SERVER_TZ.
"""
import json
import os
import sys

os.environ["TZ"] = os.environ.get("METERLINE_CHDB_SERVER_TZ") or "UTC"

from chdb import session  # noqa: E402


def main():
    req = json.load(sys.stdin)
    s = session.Session(req["path"])
    db = req["database"]
    out = {"results": []}
    sql = ""
    try:
        sql = "SELECT version()"
        out["version"] = str(s.query(sql, "TabSeparated")).strip()
        for sql in ["DROP DATABASE IF EXISTS " + db, "CREATE DATABASE " + db, "USE " + db]:
            s.query(sql)
        for sql in req.get("statements", []):
            s.query(sql)
        for sql in req.get("queries", []):
            out["results"].append(str(s.query(sql, "TabSeparated")))
    except Exception as e:  # chdb raises ChdbError with the server's message
        json.dump({"error": str(e), "sql": sql}, sys.stdout)
        return 1
    finally:
        s.close()
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
