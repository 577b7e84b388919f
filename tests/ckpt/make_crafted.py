#!/usr/bin/env python3
"""Writes the crafted safetensors files of tests/ckpt/crafted/.

Each file is small and wrong in one way (or right in an unusual way); the
list crafted/expect.tsv gives, per file, "OK" for a file the reader must
accept, or a piece of the FG_EFORMAT message the reader must give. The
files meta_*.safetensors are whole safetensors files (the reader accepts
them) holding a fulgur checkpoint's metadata with one field wrong; the
list crafted/meta_expect.tsv gives the piece of the FG_EFORMAT message
fg_fabric_load must give (tests/fabric/test_fabric_ckpt.c), or "FITS" for
metadata it must accept (the load then fails only on the missing tensors). The
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


# Checkpoint metadata (fg_fabric_load): a fulgur checkpoint's keys, one wrong.
META_CASES = []
GOOD_META = {"format": "fulgur-checkpoint-1", "fulgur_version": "0.1.0", "step": "12",
             "epoch": "1", "batch_in_epoch": "2", "seed": "18446744073709551615",
             "world_size": "2", "strategy": "ddp", "samples_in_epoch": "8",
             "global_batch": "4", "optimizer_steps": "12", "lr": "0.003",
             "loss_scale": "65536", "loss_scale_growth_tracker": "3", "loss_scale_skipped": "0"}


def meta_case(name, expect, drop=(), **kv):
    md = {k: v for k, v in GOOD_META.items() if k not in drop}
    md.update(kv)
    fname = "meta_" + name + ".safetensors"
    CASES.append((fname, pack({"__metadata__": md}), "OK"))
    META_CASES.append((fname, expect))


meta_case("good", "FITS")
meta_case("good_old", "FITS", drop=("samples_in_epoch", "global_batch", "loss_scale",
                                    "loss_scale_growth_tracker", "loss_scale_skipped", "seed"))
meta_case("step_abc", '"step" is "abc": expected a decimal integer >= 0', step="abc")
meta_case("step_negative", '"step" is "-5": expected a decimal integer >= 0', step="-5")
meta_case("step_plus", '"step" is "+5"', step="+5")
meta_case("step_blank", '"step" is " 5"', step=" 5")
meta_case("step_trailing", '"step" is "5x"', step="5x")
meta_case("step_empty", '"step" is ""', step="")
meta_case("step_overflow", '"step" is "9223372036854775808"', step="9223372036854775808")
meta_case("epoch_negative", '"epoch" is "-1"', epoch="-1")
meta_case("batch_in_epoch_real", '"batch_in_epoch" is "2.5"', batch_in_epoch="2.5")
meta_case("samples_negative", '"samples_in_epoch" is "-7": expected a decimal integer >= 0',
          samples_in_epoch="-7")
meta_case("global_batch_zero", '"global_batch" is "0": expected a decimal integer >= 1',
          global_batch="0")
meta_case("global_batch_alone", '"global_batch" is "4": expected it beside a "samples_in_epoch"',
          drop=("samples_in_epoch",))
meta_case("global_batch_vs_world", '"global_batch" is "5": expected a multiple of world_size 2',
          global_batch="5")
meta_case("world_size_zero", '"world_size" is "0"', world_size="0")
meta_case("world_size_huge", '"world_size" is "99999999"', world_size="99999999")
meta_case("seed_overflow", '"seed" is "18446744073709551616"', seed="18446744073709551616")
meta_case("seed_negative", '"seed" is "-1"', seed="-1")
meta_case("optimizer_steps_negative", '"optimizer_steps" is "-2"', optimizer_steps="-2")
meta_case("lr_nan", '"lr" is "nan": expected a finite number >= 0', lr="nan")
meta_case("lr_inf", '"lr" is "inf"', lr="inf")
meta_case("lr_negative", '"lr" is "-0.1"', lr="-0.1")
meta_case("lr_junk", '"lr" is "0.1abc"', lr="0.1abc")
meta_case("loss_scale_zero", '"loss_scale" is "0": expected a finite number > 0', loss_scale="0")
meta_case("loss_scale_tracker_negative", '"loss_scale_growth_tracker" is "-1"',
          loss_scale_growth_tracker="-1")
meta_case("loss_scale_missing", '"loss_scale_skipped" is "0": expected it beside a "loss_scale"',
          drop=("loss_scale", "loss_scale_growth_tracker"))
meta_case("deterministic_yes", '"deterministic" is "yes"', deterministic="yes")


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
    with open(os.path.join(OUT, "meta_expect.tsv"), "w") as f:
        f.write("# file\texpected from fg_fabric_load: FITS (only the tensors are missing), or a "
                "piece of the FG_EFORMAT message (make_crafted.py)\n")
        for name, expect in META_CASES:
            f.write("%s\t%s\n" % (name, expect))
    print("wrote %d files to %s" % (len(CASES), OUT))


if __name__ == "__main__":
    main()
