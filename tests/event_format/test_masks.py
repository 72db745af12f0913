"""event_format.masks: what each mask writes, and the two forms masks travel in (comment, message)."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from event_format.masks import Mask, MaskError, comment_text, from_comment, from_message, key_id, message_content


def test_each_mask_writes_what_it_says() -> None:
    key = b"sixteen byte key!"
    assert Mask.parse("hash").function(key)("ab\u00e9") == hmac.new(key, "ab\u00e9".encode(), hashlib.sha256).hexdigest()
    assert Mask.parse("hash").function(key)("x") == Mask("hash").function(key)("x")  # the same value, the same mask
    assert Mask.parse("hash").function(key)("x") != Mask("hash").function(b"another key of 16b")("x")
    assert Mask.parse("fixed:***").function(None)("anything") == "***"
    assert Mask.parse("fixed:").function(None)("anything") == ""
    assert Mask.parse("truncate:2").function(None)("\u00e9t\u00e9") == "\u00e9t"  # characters, not bytes
    assert Mask.parse("truncate:9").function(None)("short") == "short"


@pytest.mark.parametrize("spec", ["hash", "fixed:a:b", "truncate:4"])
def test_a_spec_reads_back_as_itself(spec: str) -> None:
    assert Mask.parse(spec).spec == spec


@pytest.mark.parametrize("spec", ["sha1", "hash:salt", "truncate:0", "truncate:x", "truncate", ""])
def test_an_unknown_mask_is_refused(spec: str) -> None:
    with pytest.raises(MaskError, match="unknown mask"):
        Mask.parse(spec)


def test_a_hash_needs_its_key() -> None:
    with pytest.raises(MaskError, match="CDC_MASK_KEY"):
        Mask("hash").function(None)


def test_masks_travel_in_the_comment_and_the_message() -> None:
    masks = {"public.people": {"ssn": Mask("hash"), "name": Mask("truncate", length=1)}, "public.empty": {}}
    comment = comment_text(masks)
    assert comment is not None and comment.startswith("cdc masks ")
    assert from_comment(comment) == {"public.people": masks["public.people"]}
    assert comment_text({"public.empty": {}}) is None
    assert from_comment(None) == {} and from_comment("a comment of the publication's owner") == {}
    content = message_content("cdc_publication", masks)
    assert from_message(content, "cdc_publication") == {"public.people": masks["public.people"]}
    assert from_message(content, "another_publication") is None


def test_the_key_id_tells_keys_apart_and_hides_them() -> None:
    assert key_id(None) == "" and key_id(b"") == ""
    first, second = key_id(b"sixteen byte key!"), key_id(b"sixteen byte key?")
    assert first != second and len(first) == 16 and "sixteen" not in first
