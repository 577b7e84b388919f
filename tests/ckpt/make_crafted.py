#!/usr/bin/env python3
"""Writes the crafted safetensors files of tests/ckpt/crafted/.

Each file is small and wrong in one way (or right in an unusual way); the
list crafted/expect.tsv gives, per file, "OK" for a file the reader must
accept, or a piece of the FG_EFORMAT message the reader must give. The
files are committed, so the tests need no Python; run this again after
changing it:

    python3 tests/ckpt/make_crafted.py

Standard library only.
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "crafted")


def pack(header, data=b"", pad=True, length=None):
    """A safetensors file: header (str/bytes/dict), padded with spaces to a
    multiple of 8 unless pad is False; length overrides the length field."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode("utf-8")
    if pad:
        header += b" " * (-len(header) % 8)
    n = len(header) if length is None else length
    return struct.pack("<Q", n) + header + data


def f32(*vals):
    return struct.pack("<%df" % len(vals), *vals)


def t(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


CASES = []


def case(name, content, expect):
    CASES.append((name + ".safetensors", content, expect))


# Files the reader must accept.
case("good", pack({"__metadata__": {"format": "pt", "step": "40"},
                   "a": t("F32", [2, 2], 0, 16), "b": t("I64", [1], 16, 24)},
                  f32(1, 2, 3, 4) + struct.pack("<q", -7)), "OK")
case("good_unpadded", pack({"a": t("F32", [2], 0, 8)}, f32(1, 2), pad=False), "OK")
case("good_metadata_null", pack({"__metadata__": None, "a": t("U8", [3], 0, 3)}, b"xyz"), "OK")
case("good_empty", pack({}), "OK")
case("good_zero_size", pack({"z": t("F32", [0, 5], 0, 0), "s": t("F64", [], 0, 8)},
                            struct.pack("<d", 2.5)), "OK")
case("good_other_dtypes", pack({"m": t("BOOL", [3], 0, 3), "q": t("I8", [2], 3, 5),
                                "u": t("U64", [1], 5, 13)}, b"\x01\x00\x01\xff\x02" + b"\x00" * 8),
     "OK")
case("good_unknown_field", pack({"a": t("F32", [1], 0, 4) | {"extra": [1, {"x": 2}]}}, f32(9)),
     "OK")

# Length field and framing.
case("empty", b"", "too short")
case("truncated_length", b"\x10\x00\x00", "too short")
case("huge_header_length", pack("{}", length=1 << 63), "exceeds the 100000000-byte limit")
case("header_length_over_cap", pack("{}", length=100_000_001), "exceeds the 100000000-byte limit")
case("header_past_eof", pack('{"a":1}', length=1000), "runs past the end")
case("header_length_zero", pack("", length=0, data=b"{}      "), "does not start with '{'")
case("header_not_object", pack("[1, 2, 3]"), "does not start with '{'")
case("header_leading_space", pack(' {"a":1}'), "does not start with '{'")
case("truncated_header", pack({"a": t("F32", [2], 0, 8)}, f32(1, 2))[:30], "runs past the end")
case("truncated_data", pack({"a": t("F32", [4], 0, 16)}, f32(1, 2, 3, 4))[:-5],
     "run past the end")

# JSON itself.
case("invalid_json", pack('{"a": {"dtype": "F32",'), "not valid JSON")
case("json_junk_after_object", pack('{} x'), "not valid JSON")
case("json_nul_byte", pack(b'{"a\x00b": 1}'), "not valid JSON")
case("json_bad_utf8_name", pack(b'{"\xff\xfe": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}'),
     "not valid JSON")
case("json_escaped_nul_name", pack('{"a\\u0000b": {"dtype": "U8", "shape": [0], '
                                   '"data_offsets": [0, 0]}}'), "not valid JSON")
case("json_deep_nesting", pack('{"a": ' + "[" * 5000 + "]" * 5000 + "}"), "not valid JSON")
case("json_integer_too_big", pack('{"a": {"dtype": "U8", "shape": [100000000000000000000], '
                                  '"data_offsets": [0, 0]}}'), "not valid JSON")
case("duplicate_names", pack('{"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, '
                             '"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}', b"xy"),
     "duplicate")

# Entry fields.
case("entry_not_object", pack({"a": 5}), 'tensor "a": expected an object')
case("empty_name", pack({"": t("U8", [1], 0, 1)}, b"x"), "empty name")
case("missing_dtype", pack({"a": {"shape": [1], "data_offsets": [0, 4]}}, f32(1)), 'missing "dtype"')
case("dtype_not_string", pack({"a": t(4, [1], 0, 4)}, f32(1)), '"dtype" is an integer')
case("unknown_dtype", pack({"a": t("Q7", [1], 0, 4)}, f32(1)), 'unknown dtype "Q7"')
case("dtype_lowercase", pack({"a": t("f32", [1], 0, 4)}, f32(1)), 'unknown dtype "f32"')
case("missing_shape", pack({"a": {"dtype": "F32", "data_offsets": [0, 4]}}, f32(1)), 'missing "shape"')
case("shape_not_array", pack({"a": t("F32", 4, 0, 4)}, f32(1)), '"shape" is an integer')
case("shape_entry_string", pack({"a": t("F32", ["1"], 0, 4)}, f32(1)), "shape[0] is a string")
case("shape_entry_real", pack({"a": t("F32", [1.0], 0, 4)}, f32(1)), "shape[0] is a real number")
case("shape_negative", pack({"a": t("F32", [2, -2], 0, 16)}, f32(1, 2, 3, 4)), "shape[1] = -2 is negative")
case("shape_overflow_int64", pack({"a": t("F32", [1 << 62, 1 << 62, 4], 0, 4)}, f32(1)),
     "more bytes than 64 bits")
case("shape_overflow_bytes", pack({"a": t("F64", [1 << 60, 4], 0, 8)}, f32(1, 2)),
     "more bytes than 64 bits")
case("shape_too_many_dims", pack({"a": t("F32", [1] * 65, 0, 4)}, f32(1)), "65 dimensions")
case("missing_offsets", pack({"a": {"dtype": "F32", "shape": [1]}}, f32(1)), 'missing "data_offsets"')
case("offsets_not_array", pack({"a": {"dtype": "F32", "shape": [1], "data_offsets": "0-4"}}, f32(1)),
     '"data_offsets" is a string')
case("offsets_three", pack({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}}, f32(1, 2)),
     "not of 2 entries")
case("offsets_real", pack({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4.0]}}, f32(1)),
     "expected two integers")
case("offsets_negative", pack({"a": t("F32", [1], -4, 0)}, f32(1)), "are negative")
case("offsets_reversed", pack({"a": t("F32", [1], 4, 0)}, f32(1)), "end before they begin")
case("offsets_out_of_range", pack({"a": t("F32", [1024], 0, 4096)}, f32(1, 2)),
     "run past the end of the 8-byte data buffer")
case("offsets_huge", pack({"a": t("U8", [4], (1 << 63) - 5, (1 << 63) - 1)}, b"abcd"),
     "run past the end")
case("offsets_vs_shape", pack({"h.0.attn.weight": t("F32", [32, 64], 0, 4096)}, b"\0" * 4096),
     'tensor "h.0.attn.weight": data_offsets [0, 4096] but shape [32, 64] of F32 needs 8192 bytes')
case("overlap", pack({"a": t("F32", [2], 0, 8), "b": t("F32", [2], 4, 12)}, f32(1, 2, 3)),
     'overlap tensor "a"')
case("overlap_same", pack({"a": t("F32", [2], 0, 8), "b": t("F32", [2], 0, 8)}, f32(1, 2)),
     "overlap")
case("gap", pack({"a": t("F32", [2], 0, 8), "b": t("F32", [2], 12, 20)}, f32(1, 2, 3, 4, 5)),
     "no gaps")
case("gap_at_start", pack({"a": t("F32", [1], 4, 8)}, f32(1, 2)), "no gaps")
case("trailing_garbage", pack({"a": t("F32", [2], 0, 8)}, f32(1, 2) + b"junk"),
     "4 bytes follow the last tensor")
case("data_without_tensors", pack({}, b"abc"), "3 bytes follow")

# Metadata.
case("metadata_not_object", pack({"__metadata__": ["a"], "a": t("U8", [1], 0, 1)}, b"x"),
     '"__metadata__" is an array')
case("metadata_value_int", pack({"__metadata__": {"step": 40}}), 'metadata "step" is an integer')
case("metadata_value_object", pack({"__metadata__": {"cfg": {"lr": "1"}}}), 'metadata "cfg" is an object')


def main():
    os.makedirs(OUT, exist_ok=True)
    for old in os.listdir(OUT):
        if old.endswith(".safetensors"):
            os.remove(os.path.join(OUT, old))
    with open(os.path.join(OUT, "expect.tsv"), "w") as f:
        f.write("# file\texpected: OK, or a piece of the FG_EFORMAT message (make_crafted.py)\n")
        for name, content, expect in CASES:
            with open(os.path.join(OUT, name), "wb") as g:
                g.write(content)
            f.write("%s\t%s\n" % (name, expect))
    print("wrote %d files to %s" % (len(CASES), OUT))


if __name__ == "__main__":
    main()
