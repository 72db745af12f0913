"""The views file: its shape checked on load, its tables against the captured ones, each error one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from derived_views.definitions import ViewDefinitions, check, load
from derived_views.errors import ViewsFileError

REPOSITORY = Path(__file__).resolve().parents[2]


def _load(tmp_path: Path, text: str) -> ViewDefinitions:
    path = tmp_path / "views.toml"
    path.write_text(text)
    return load(path)


def test_no_file_means_every_captured_table_with_its_history(tmp_path: Path) -> None:
    definitions = load(tmp_path / "views.toml")
    assert definitions.warehouse.keeps("public.x") and definitions.warehouse.keeps_history("public.x")
    check(definitions, ["public.x"])


def test_a_file_chooses_tables_and_their_history(tmp_path: Path) -> None:
    definitions = _load(tmp_path, '[warehouse]\ntables = ["public.a", "Sales Q1.b"]\nwithout_history = ["public.a"]\n')
    assert definitions.warehouse.keeps("Sales Q1.b") and not definitions.warehouse.keeps("public.c")
    assert not definitions.warehouse.keeps_history("public.a") and definitions.warehouse.keeps_history("Sales Q1.b")
    check(definitions, ["public.a", "Sales Q1.b", "public.c"])


def test_the_example_file_is_valid_for_the_reference_schema() -> None:
    definitions = load(REPOSITORY / "views.example.toml")
    check(definitions, ["public.customers", "public.categories", "public.products", "public.orders", "public.order_items"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[warehouse\n", r"views.toml: not valid TOML: .*line 1"),
        (
            "[warehous]\n",
            r"views.toml: \[warehous\] is not a section of the views file \(known: \[warehouse\], "
            r"\[search.<index>\], \[cache.<entity>\], \[capture.\"<schema>.<table>\"\], \[outbox.\"<schema>.<table>\"\]\)",
        ),
        (
            '[outbox."public.outbox"]\naggregate = "a"\n',
            r"\[outbox.public.outbox\] aggregate is not a key of \[outbox.public.outbox\] "
            r"\(known: id, aggregatetype, aggregateid, type, payload\)",
        ),
        (
            '[capture."public.a"]\ncolumns = ["a"]\nexclude = ["b"]\n',
            r"\[capture.public.a\]: give `columns` or `exclude`, not both",
        ),
        (
            '[capture."public.a"]\nfilter = "x"\n',
            r"\[capture.public.a\] filter is not a key of \[capture.public.a\] \(known: columns, exclude, where, mask\)",
        ),
        ("[warehouse]\ntable = []\n", r"\[warehouse\] table is not a key of \[warehouse\] \(known: tables, without_history\)"),
        ('[warehouse]\ntables = "public.a"\n', r"\[warehouse\] tables: Input should be a valid list"),
        ('[warehouse]\ntables = ["public.a", "public.a"]\n', r"\[warehouse\] tables: 'public.a' is listed twice"),
        ('[warehouse]\ntables = ["orders"]\n', r"\[warehouse\] tables: 'orders' is not schema.table"),
    ],
)
def test_a_malformed_file_gets_one_error_naming_the_file_section_and_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ViewsFileError, match=message) as caught:
        _load(tmp_path, text)
    assert "\n" not in str(caught.value) and caught.value.exit_code == 2


def test_a_table_that_is_not_captured_is_refused_with_the_fix(tmp_path: Path) -> None:
    definitions = _load(tmp_path, '[warehouse]\ntables = ["public.a"]\nwithout_history = ["public.nope"]\n')
    with pytest.raises(
        ViewsFileError,
        match=r"\[warehouse\] without_history: public.nope is not a captured table "
        r"\(captured: public.a\); name a table of the publication",
    ):
        check(definitions, ["public.a"])


@pytest.mark.pg
@pytest.mark.spark
@pytest.mark.slow
def test_the_warehouse_keeps_the_tables_the_file_names_and_cdc_views_lists_them(
    spark: object, reference_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the named tables get warehouse tables (one without history); ``cdc views`` lists them with
    the LSN they are as of; ``verify`` compares exactly those; setup refuses a table that is not captured."""
    import json

    from cdc.cli import cli, run
    from cdc.commands import register
    from derived_views.runs import runner
    from tests.derived_views.pipeline import capture, context, execute, settings_for, verify_views

    views_file = tmp_path / "views.toml"
    views_file.write_text(
        '[warehouse]\ntables = ["public.categories", "public.products"]\nwithout_history = ["public.categories"]\n'
    )
    execute(
        reference_db,
        "INSERT INTO categories (name) VALUES ('Lighting')",
        "INSERT INTO products (category_id, name, price) VALUES (1, 'Lamp', 10)",
    )
    settings = settings_for(reference_db, tmp_path / "data", views_file=str(views_file))
    capture(settings)
    ctx = context(spark, settings)  # type: ignore[arg-type]
    runner.step(ctx, ["warehouse"])
    assert verify_views(ctx, reference_db, ["warehouse"]) == 2
    made = sorted(str(p.parent.relative_to(tmp_path / "data")) for p in (tmp_path / "data").rglob("_delta_log"))
    assert made == [
        "warehouse/current/public.categories",
        "warehouse/current/public.products",
        "warehouse/history/public.products",
    ]

    register(cli)
    for name, value in {
        "CDC_DATABASE_URL": reference_db,
        "CDC_DATA_DIR": str(tmp_path / "data"),
        "CDC_VIEWS_FILE": str(views_file),
    }.items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    assert run(cli, ["views", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    warehouse = [t for t in listed["tables"] if t["view"] == "warehouse"]
    assert [t["holds"] for t in warehouse] == [
        "public.categories (current)",
        "public.products (current)",
        "public.products (history)",
    ]
    assert all(t["as_of_lsn"] for t in warehouse) and listed["definitions"] == str(views_file)

    views_file.write_text('[warehouse]\ntables = ["public.nope"]\n')
    assert run(cli, ["setup", "--check-only"]) != 0
    assert "public.nope is not a captured table" in capsys.readouterr().err
    assert run(cli, ["views"]) == 2
    # a search index is checked against the source's columns by setup, before any capture
    views_file.write_text('[search.products]\nroot = "public.products"\ntext = ["name", "colour"]\n')
    assert run(cli, ["setup", "--check-only"]) != 0
    assert "[search.products] text: 'colour' is not a column of the document" in capsys.readouterr().err
    views_file.write_text('[search.products]\nroot = "public.products"\ntext = ["name", "price"]\n')
    assert run(cli, ["views"]) == 2
    assert "[search.products] text: 'price' is numeric, not text" in capsys.readouterr().err
