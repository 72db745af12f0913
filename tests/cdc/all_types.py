"""A column of every type capture converts, with rows at the edges of each: the type-coverage table.

``TYPES`` creates the enum and domains the columns use; ``COLUMNS`` follows an ``id int PRIMARY KEY``;
``ROWS`` are the ``VALUES`` of four rows (ids 1 to 4: all nulls, typical values, edges, more edges).
"""

from __future__ import annotations

#: The user-defined types the columns use.
TYPES = (
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE DOMAIN posint AS integer CHECK (VALUE > 0)",
    "CREATE DOMAIN amount AS numeric(12, 2)",
    "CREATE DOMAIN utc_moment AS timestamptz",
)

#: The columns after the key.
COLUMNS = """
    i2 int2, i8 int8, o oid, f4 float4, f8 float8, n numeric, n2 numeric(12,2), b bool, t text,
    vc varchar(20), bp char(5), nm name, u uuid, j json, jb jsonb, ba bytea, d date, tm time, tmtz timetz,
    ts timestamp, tstz timestamptz, iv interval, mn money, ip inet, cd cidr, mac macaddr, bt bit(4),
    vb varbit, x xml, ch "char", e mood, dp posint, dn amount, dt utc_moment,
    a_int int[], a_text text[], a_num numeric[], a_tstz timestamptz[], a_jsonb jsonb[], a_bytea bytea[],
    a_bool bool[], a_f8 float8[], a_uuid uuid[], a_date date[], a_enum mood[], a_2d int[][],
    a_bounds int[], a_bp char(3)[], a_vc varchar[]
"""

#: Four rows' VALUES, ids 1 to 4.
ROWS = [
    "(1" + ", NULL" * 49 + ")",
    """(2, 7, 9007199254740993, 42, 1.5, 2.25, 12345678901234567890.0123456789, 19.90, true, 'plain',
        'vc', 'ab', 'nm', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, 2.50]}', '{"b": {"c": null}}',
        '\\xdeadbeef', '2026-11-21', '13:45:00.123456', '13:45:00+02', '2026-11-21 13:45:00.5',
        '2026-11-21 13:45:00.123456+05:30', '1 year 2 mons 3 days 04:05:06.7', 12.34, '10.0.0.1',
        '10.0.0.0/8', '08:00:2b:01:02:03', B'1010', B'101', '<a>x</a>', 'c', 'happy', 5, 3.10,
        '2026-01-01 00:00:00+00', '{1,2,NULL}', '{"a b","c,d","e\\"f","g\\\\h",NULL,""}',
        '{1.10,NaN,NULL}', '{"2026-11-21 13:45:00+01",infinity}', ARRAY['{"k": 1}'::jsonb, '[]'],
        ARRAY['\\x00ff'::bytea], '{t,f,NULL}', '{1e+20,1.5e-07,NaN,-Infinity}',
        '{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}', '{2026-11-21,-infinity}', '{sad,ok}',
        '{{1,2},{3,NULL}}', '[2:3]={7,8}', '{"a  ","b"}', '{"x y",z}')""",
    """(3, -32768, -9223372036854775808, 0, 'NaN', '-Infinity', 'NaN', -0.01, false,
        E'tab\\there\\nnew "quoted" back\\\\slash \\x01 é ✓', '', 'a', '', '00000000-0000-0000-0000-000000000000',
        '"just a string"', '[1, "two", {"3": 4}]', decode(repeat('ab', 100), 'hex'), 'infinity',
        '00:00:00', '23:59:59.999999-05:30:15', 'infinity', '-infinity', '-1 days -00:00:01', -1.00,
        '::1', '2001:db8::/32', '00:00:00:00:00:00', B'0000', B'', '<empty/>', ' ', 'sad', 1, -0.50,
        'infinity', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}')""",
    """(4, 1, 1, 1, 1e+20, 1.5e-07, '0.000100', 0, true, 'x', 'x', 'x', 'x', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
        '{}', '{}', '\\x', '0044-03-15 BC', '12:00:00', '12:00:00-00', '0044-03-15 12:00:00 BC',
        '0001-01-01 00:00:00+00', '00:00:00', 0, '192.168.0.1/24', '192.168.0.0/24', '01:02:03:04:05:06',
        B'1111', B'1', '<a/>', 'z', 'ok', 2, 0, '1999-12-31 23:59:59.999999+14',
        '{-1}', '{"NULL","null"}', '{0.0}', '{"0044-03-15 12:00:00+00 BC"}', '{"\\"s\\""}', '{"\\\\x"}',
        '{f}', '{Infinity}', '{}', '{infinity}', '{happy}', '{{{1}}}', '[-1:-1]={5}', '{"   "}', '{""}')""",
]
