#!/usr/bin/env python3
"""Writes the awkward CSV/TSV files of tests/data/test_csv.c and what Python's csv module reads
from them (tests/data/csv/*_ref.txt), so the C reader is checked against it.

Run from the repository root: python3 tests/ref/gen_csv_ref.py

Each ref file has, per data row, a line "row <label> <x0> <x1> ..." (repr of the double each
value parses to; the C side rounds it to f32 as the reader does), per category column lines
"cat <column> <k> <hex of the UTF-8 text>", and "missing <line> <column name>" for the first
missing value (the line its record starts on), for the error test."""
import csv
import gzip
import io
import os

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "csv")

# Quotes and doubled quotes, separators and line breaks inside quotes (the header too), CRLF and
# LF mixed, a blank line, spaces around numbers, exponents, a quoted number, a missing value, a
# UTF-8 text, and no line break after the last record.
AWKWARD = (
    'id,"name, full",score,"note\nmulti",label\r\n'
    '1,plain,3.5,"a ""quoted"" word",0\r\n'
    '2,"comma, inside", 2.25 ,"two\nlines",1\n'
    '\n'
    '-3,"", -1e-3,x,2\n'
    '4,plain,,"",0\r\n'
    '5,"é ü",1E+2,"three\r\nline\nbreaks",1\n'
    '6,"""lead",  7 ,"sep,sep",2\n'
    '7,plain,"8.125",,1'
)
TYPES = {"id": "int", "name, full": "cat", "score": "float", "note\nmulti": "cat", "label": "int"}
FILL = -1.0  # the fill value the C test passes


def ref(rows_text, delim):
    rd = csv.reader(io.StringIO(rows_text, newline=""), delimiter=delim)
    rows, starts, last = [], [], 0
    for r in rd:
        if r:
            rows.append(r)
            starts.append(last + 1)
        last = rd.line_num
    header, data, starts = rows[0], rows[1:], starts[1:]
    cats = {}
    for j, name in enumerate(header):
        if TYPES[name] == "cat":
            cats[name] = sorted({r[j] for r in data}, key=lambda s: s.encode())
    out, missing = [], None
    for r, line in zip(data, starts):
        vals = []
        for j, name in enumerate(header):
            v, t = r[j], TYPES[name]
            if t == "cat":
                vals.append(float(cats[name].index(v)))
            elif v == "":
                if missing is None:
                    missing = (line, name)
                vals.append(FILL)
            else:
                vals.append(float(int(v)) if t == "int" else float(v))
        y, x = vals[-1], vals[:-1]
        out.append("row %d %s" % (int(y), " ".join(repr(v) for v in x)))
    for name, texts in cats.items():
        for k, t in enumerate(texts):
            out.append("cat %s %d %s" % (name.encode().hex(), k, t.encode().hex() or "-"))
    out.append("missing %d %s" % missing)
    return "\n".join(out) + "\n", header, data


def main():
    os.makedirs(OUT, exist_ok=True)
    raw = AWKWARD.encode()
    with open(os.path.join(OUT, "awkward.csv"), "wb") as f:
        f.write(raw)
    text, header, data = ref(AWKWARD, ",")
    with open(os.path.join(OUT, "awkward_ref.txt"), "w") as f:
        f.write(text)
    # the same file gzip-compressed as two members (as `cat a.gz b.gz` makes); mtime 0 keeps
    # the bytes the same on every run
    half = len(raw) // 2
    with open(os.path.join(OUT, "awkward.csv.gz"), "wb") as f:
        f.write(gzip.compress(raw[:half], 9, mtime=0) + gzip.compress(raw[half:], 9, mtime=0))
    # the same table as TSV, written by csv.writer (it quotes what needs it)
    buf = io.StringIO(newline="")
    csv.writer(buf, delimiter="\t", lineterminator="\n").writerows([header] + data)
    tsv = buf.getvalue()
    with open(os.path.join(OUT, "awkward.tsv"), "wb") as f:
        f.write(tsv.encode())
    text_tsv, _, _ = ref(tsv, "\t")
    with open(os.path.join(OUT, "awkward_tsv_ref.txt"), "w") as f:
        f.write(text_tsv)


if __name__ == "__main__":
    main()
