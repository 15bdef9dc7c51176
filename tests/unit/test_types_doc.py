"""docs/types.md is what the type table in the code says, and the code reads that table."""

from __future__ import annotations

from reconcile.core.checksum import KINDS
from sinks.postgres import schema
from sinks.postgres.arrow_types import PG_TYPES, recovery_kind
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
