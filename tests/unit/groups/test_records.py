from __future__ import annotations

from tidalmq_broker.groups.records import (
    GroupKey,
    GroupValue,
    MemberValue,
    OffsetKey,
    OffsetValue,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
    java_string_hash,
    partition_for_group,
)


def test_java_string_hash_matches_java() -> None:
    # values of String.hashCode() in Java
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -2147483648
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112


def test_group_placement_is_kafkas() -> None:
    # Kafka: Utils.abs(hashCode) % 50; abs maps MIN_VALUE to 0
    assert partition_for_group("polygenelubricants", 50) == 0
    assert partition_for_group("hello", 50) == 99162322 % 50


def test_keys_and_values_round_trip() -> None:
    ok = OffsetKey("g", "t", 3)
    assert decode_key(encode_key(ok)) == ok
    ov = OffsetValue(10, 2, "meta", 123)
    assert decode_value(ok, encode_value(ov)) == ov
    gk = GroupKey("g")
    gv = GroupValue(
        "consumer",
        4,
        "range",
        "m1",
        (MemberValue("m1", None, "c", "/h", 10000, 30000, b"\x00\x01", b"\xff"),),
        9,
    )
    assert decode_value(gk, encode_value(gv)) == gv
    assert encode_value(None) is None and decode_value(gk, None) is None
