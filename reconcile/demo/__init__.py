"""``reconcile demo``: the TPC-H streaming demo (``tpch``) on an embedded PostgreSQL
(``embedded_pg``), and the smaller file-sink demo (``files``)."""
