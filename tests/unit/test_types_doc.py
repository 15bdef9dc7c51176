"""docs/types.md is what the type table in the code says, and the code reads that table."""

from __future__ import annotations

import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]
from sqlalchemy.dialects import mysql

from reconcile.core.checksum import KINDS
from reconcile.core.value_forms import ValueForm
from sinks.postgres import schema
from sinks.postgres.arrow_types import PG_TYPES, recovery_kind
from sinks.sql.mariadb_types import (
    MARIADB_TYPES,
    mariadb_arrow_type,
    mariadb_form,
    mariadb_refusal,
)
from sinks.types_doc import PAGE, main, render


def test_docs_types_md_is_rendered_from_the_code() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), "run: python -m sinks.types_doc"
    assert main(["--check"]) == 0


def test_every_type_the_table_holds_is_written_and_compared() -> None:
    held = [name for entry in PG_TYPES if entry.store is not None for name in entry.typnames]
    assert {"json", "jsonb", "uuid", "bpchar", "varchar", "numeric"} <= set(held)
    for typname in held:
        kind = recovery_kind(typname)
        assert kind in KINDS, (typname, kind)  # verify's buckets checksum it
        assert schema._KINDS.get(typname, "other") != "other", typname  # the sink writes it
    # A type the table refuses or does not know is not compared.
    assert recovery_kind("xml") == recovery_kind("interval") == "other"


def test_the_page_names_each_form_the_code_applies() -> None:
    page = render()
    for row in ("| jsonb | string |", "| uuid | string |", "| char(n), character(n), bpchar |"):
        assert row in page
    assert "form `bpchar(n)`" in page and "form `uuid`" in page and "form `jsonb`" in page


def test_the_mariadb_table_is_a_section_the_code_reads() -> None:
    page = render()
    assert "## PostgreSQL" in page and "## MariaDB and MySQL" in page
    for row in ("| CHAR(n) | string |", "| BINARY(n) | binary |", "| SET | the server"):
        assert row in page
    # The registry is what the sink's schema comes from (sinks.sql.arrow_types).
    assert mariadb_arrow_type(mysql.INTEGER(unsigned=True)) == pa.int64()
    assert mariadb_arrow_type(mysql.FLOAT()) == pa.float32()
    assert mariadb_arrow_type(mysql.FLOAT(precision=10, scale=2)) is None
    assert mariadb_form(mysql.DATETIME()) == ValueForm("fraction", 0)
    assert mariadb_form(mysql.TIMESTAMP(fsp=6)) is None
    assert mariadb_form(mysql.CHAR(4)) == ValueForm("rtrim", 4)
    assert mariadb_form(mysql.TINYINT(display_width=1)) is None
    assert mariadb_arrow_type(mysql.TINYINT(display_width=1)) == pa.bool_()
    assert mariadb_refusal(mysql.SET("a")) == next(
        e.doc.refused for e in MARIADB_TYPES if e.doc.sql == "SET"
    )
    assert mariadb_refusal(mysql.DECIMAL(65, 30)) is not None
    assert mariadb_refusal(mysql.DECIMAL(38, 2)) is None
