"""Search index and cache entity definitions: each mistake gets one error naming the file, the view and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from derived_views.definitions import load
from derived_views.errors import ViewsFileError
from derived_views.views.composite import Composite, SourceTable, checked

REPOSITORY = Path(__file__).resolve().parents[3]

#: A blog, with names that need quoting in SQL.
TABLES = {
    t.dotted_name: t
    for t in (
        SourceTable(
            "Blog Data.Authors",
            "Blog Data.Authors",
            {"AuthorId": "int4", "Name": "text", "team_id": "int4", "e-mail": "varchar"},
            ("AuthorId",),
        ),
        SourceTable("Blog Data.teams", "Blog Data.teams", {"id": "int4", "name": "text", "lead": "int4"}, ("id",)),
        SourceTable(
            "Blog Data.Posts",
            "Blog Data.Posts",
            {"id": "int8", "author": "int4", "title": "text", "tags": "_text", "views": "int4", "published": "bool"},
            ("id",),
        ),
        SourceTable(
            "Blog Data.comments",
            "Blog Data.comments",
            {"id": "int8", "post_id": "int8", "body": "text", "at": "timestamptz"},
            ("id",),
        ),
        SourceTable("Blog Data.loose", "Blog Data.loose", {"v": "text"}, ()),
    )
}

SEARCH = """
[search.posts]
root = "Blog Data.Posts"
text = ["title", "tags", "author_name"]
stored = ["title", "team"]
filter = "published AND `views` >= 0"

[search.posts.joins.author]
table = "Blog Data.Authors"
on = "author"
columns = { author_name = "Name", "author-mail" = "e-mail" }

[search.posts.joins.team]
table = "Blog Data.teams"
from = "author"
on = "team_id"
columns = { team = "name" }
"""

CACHE = """
[cache.post]
root = "Blog Data.Posts"
key = "id"
columns = ["id", "title"]

[cache.post.lookups.author]
table = "Blog Data.Authors"
on = "author"
columns = { author_name = "Name" }

[cache.post.children.comments]
table = "Blog Data.comments"
on = "post_id"
order_by = ["at"]
columns = ["id", "body"]
"""


def _plans(tmp_path: Path, text: str) -> list[Composite]:
    path = tmp_path / "views.toml"
    path.write_text(text)
    return checked(load(path), TABLES)


def test_a_search_index_and_a_cache_entity_become_plans(tmp_path: Path) -> None:
    search, cache = _plans(tmp_path, SEARCH + CACHE)
    assert search.view == "search.posts" and cache.view == "cache.post"
    assert [link.alias for link in search.links] == ["author", "team"] and search.links[1].parent == "author"
    assert search.output_columns == ("id", "author", "title", "tags", "views", "published", "author_name", "author-mail", "team")
    assert [t.dotted_name for t in search.tables] == ["Blog Data.Posts", "Blog Data.Authors", "Blog Data.teams"]
    assert cache.output_columns == ("id", "title", "author_name")
    assert cache.children[0].order_by == ("at",) and cache.children[0].columns == ("id", "body")
    # the fingerprint follows the definition, not the order of the file, and not what is only read
    again = _plans(tmp_path, SEARCH.replace('stored = ["title", "team"]', 'stored = ["title"]') + CACHE)
    assert again[0].fingerprint == search.fingerprint
    changed = _plans(tmp_path, SEARCH.replace("`views` >= 0", "`views` > 0") + CACHE)
    assert changed[0].fingerprint != search.fingerprint and changed[1].fingerprint == cache.fingerprint


def test_the_example_file_defines_the_reference_views() -> None:
    reference = {
        "public.products": SourceTable(
            "public.products",
            "public.products",
            {
                "id": "int8",
                "category_id": "int4",
                "name": "text",
                "description": "text",
                "price": "numeric",
                "attributes": "jsonb",
                "tags": "_text",
                "updated_at": "timestamptz",
            },
            ("id",),
        ),
        "public.categories": SourceTable("public.categories", "public.categories", {"id": "int4", "name": "text"}, ("id",)),
        "public.orders": SourceTable(
            "public.orders",
            "public.orders",
            {"id": "uuid", "customer_id": "int8", "status": "order_status", "placed_at": "timestamptz", "total": "numeric"},
            ("id",),
        ),
        "public.order_items": SourceTable(
            "public.order_items",
            "public.order_items",
            {"order_id": "uuid", "line_no": "int4", "product_id": "int8", "quantity": "int4", "unit_price": "numeric"},
            ("order_id", "line_no"),
        ),
        "public.customers": SourceTable("public.customers", "public.customers", {"id": "int8"}, ("id",)),
    }
    search, cache = checked(load(REPOSITORY / "views.example.toml"), reference)
    assert search.view == "search.products" and search.output_columns[-1] == "category_name"
    assert cache.view == "cache.order" and cache.children[0].alias == "items"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(
            ('root = "Blog Data.Posts"\ntext', 'root = "Blog Data.Nope"\ntext'),
            r"\[search.posts\] root: Blog Data.Nope is not a captured table \(captured: .*Blog Data.Posts",
            id="unknown table",
        ),
        pytest.param(
            ('text = ["title"', 'text = ["titel"'),
            r"\[search.posts\] text: 'titel' is not a column of the document \(columns: id, author, ",
            id="unknown column",
        ),
        pytest.param(
            ('on = "author"\ncolumns = { author_name', 'on = "writer"\ncolumns = { author_name'),
            r"\[search.posts\] joins.author.on: 'writer' is not a column of Blog Data.Posts",
            id="join on a column that does not exist",
        ),
        pytest.param(
            ('table = "Blog Data.teams"', 'table = "Blog Data.loose"'),
            r"\[search.posts\] joins.team.table: Blog Data.loose has no primary key",
            id="join target without a key",
        ),
        pytest.param(
            ('table = "Blog Data.Authors"\non = "author"', 'table = "Blog Data.Authors"\nfrom = "team"\non = "lead"'),
            r"\[search.posts\] joins: the joins author, team form a cycle through `from`",
            id="cycle",
        ),
        pytest.param(
            ('text = ["title", "tags", "author_name"]', 'text = ["title", "views"]'),
            r"\[search.posts\] text: 'views' is int4, not text",
            id="text field that is not text",
        ),
        pytest.param(
            ('filter = "published AND `views` >= 0"', 'filter = "published AND (views >"'),
            r"\[search.posts\] filter: 'published AND \(views >' does not parse as a Spark SQL expression",
            id="filter that does not parse",
        ),
        pytest.param(
            ('filter = "published AND `views` >= 0"', 'filter = "published AND likes > 3"'),
            r"\[search.posts\] filter: likes is not a column of the document",
            id="filter over an unknown column",
        ),
        pytest.param(
            ('columns = { team = "name" }', 'columns = { title = "name" }'),
            r"\[search.posts\] joins.team.columns: 'title' is also a column of the root: give it another name",
            id="duplicate name",
        ),
        pytest.param(
            ('columns = { author_name = "Name" }', 'columns = { TITLE = "Name" }'),
            r"\[cache.post\] lookups.author.columns: 'TITLE' is also a column of the root",
            id="duplicate name in another case",
        ),
        pytest.param(
            ('key = "id"', 'key = "title"'),
            r"\[cache.post\] key: title is not the primary key of Blog Data.Posts \(id\)",
            id="key that is not the primary key",
        ),
        pytest.param(
            ('on = "post_id"', 'on = "post"'),
            r"\[cache.post\] children.comments.on: 'post' is not a column of Blog Data.comments",
            id="child on a column that does not exist",
        ),
        pytest.param(
            ('from = "author"', 'from = "writer"'),
            r"\[search.posts\] joins.team.from: 'writer' is not one of the joins \(defined: author, team\)",
            id="from an unknown join",
        ),
        pytest.param(
            ('columns = ["id", "body"]', 'columns = ["id", "body", "body"]'),
            r"\[cache.post\] children.comments.columns: 'body' is named twice",
            id="a column named twice",
        ),
    ],
)
def test_each_bad_definition_gets_one_error_naming_the_file_view_and_key(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    text = SEARCH + CACHE
    assert change[0] in text
    with pytest.raises(ViewsFileError, match=message) as caught:
        _plans(tmp_path, text.replace(change[0], change[1], 1))
    assert str(caught.value).startswith(str(tmp_path / "views.toml") + ": ") and "\n" not in str(caught.value)
    assert caught.value.exit_code == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[search.posts]\nroot = "Blog Data.Posts"\n', r"\[search.posts\] text: Field required"),
        ('[search.posts]\nroot = "Blog Data.Posts"\ntext = []\n', r"\[search.posts\] text: name at least one document column"),
        ('[search.posts]\nroot = "Posts"\ntext = ["title"]\n', r"\[search.posts\] root: 'Posts' is not schema.table"),
        (
            '[search."my index"]\nroot = "Blog Data.Posts"\ntext = ["title"]\n',
            r"views.toml: \[search.my index\]: the name 'my index' must be letters, digits and _",
        ),
        (
            '[search.posts]\nroot = "Blog Data.Posts"\ntext = ["title"]\n[search.posts.joins.a]\ntable = "Blog Data.teams"\n'
            'on = "author"\ncolumns = {}\ncolumn = 1\n',
            r"\[search.posts\] joins.a.column is not a key of \[search.posts.joins.a\] \(known: table, on, from, columns\)",
        ),
        (
            '[cache.post]\nroot = "Blog Data.Posts"\n[cache.post.children.c]\ntable = "Blog Data.comments"\n'
            'on = "post_id"\nonn = 1\n',
            r"\[cache.post\] children.c.onn is not a key of \[cache.post.children.c\] \(known: table, on, order_by, columns\)",
        ),
    ],
)
def test_a_malformed_definition_is_refused_on_load(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ViewsFileError, match=message):
        _plans(tmp_path, text)
