"""An ``nvidia-smi`` that replays the field corpus: what a real nvidia-smi printed, for the query asked.

One host of the corpus (``tests/field/smi/<host>/``, see SOURCES.md) is replayed, named by the
environment:

- ``FIELD_SMI_HOST``: the host's directory; ``FIELD_SMI_STATE``: ``idle`` (default) or ``load``, which
  capture of a host that has both is answered;
- ``FIELD_SMI_LOG``: a file that gets one JSON line per call (the argv), for the tests;
- ``FIELD_SMI_NO_HELP=1``: ``--help-query-*`` fail (exit 255), as an nvidia-smi that cannot list its fields;
- ``FIELD_SMI_ROWS``: another host's directory whose CSV captures answer the ``--query-*`` (the fields
  accepted or refused are still the ``FIELD_SMI_HOST`` listing's): a host of the corpus that has a listing and
  no capture (the pre-R510 and R510-R525 listings) is read with real rows of another driver, taken column by
  column as for any capture. Both halves are real files; the pairing is the test's, and says so.

What it answers, and how:

- ``--help-query-gpu`` / ``--help-query-compute-apps``: the host's listing, byte for byte;
- ``-q -x``: the host's XML, byte for byte;
- ``--query-gpu=F,...`` / ``--query-compute-apps=F,...`` with ``--format=csv[,noheader][,nounits]``: a field
  the host's listing does not name is refused as the real tool refuses it (stdout ``Field "F" is not a
  valid field to query.`` and an empty line, exit 2: CoHDI/composable-resource-operator issue 37 shows
  that output and exit code). Otherwise the columns asked are taken, in the order asked, from the
  host's real CSV capture (a ``--format=csv`` output: header with units, values with units); with
  ``nounits`` the unit the header names is taken off each value (``2296 MiB`` -> ``2296``), and the header,
  when printed, keeps its units, as the real ``csv,nounits`` output in the corpus shows
  (netdata-tesla-p100-csv). Nothing else is changed: the rows are the real rows.
- anything the corpus cannot answer (no capture for that query, a column the capture lacks, another
  option): exit 99 and a line on stderr saying so, never an invented answer.
"""

from __future__ import annotations

import json
import os
import re
import sys

NO_ANSWER = 99
_LISTED = re.compile(r'^"[^"]+"(?:\s+or\s+"[^"]+")*\s*$')
_UNIT = re.compile(r"^(.*?) \[([^\]]+)\]$")


def listing_names(text: str) -> dict:
    """{name or alias: the first name of its line} from a --help-query-* listing."""
    names = {}
    for line in text.splitlines():
        if _LISTED.match(line.strip()):
            found = re.findall(r'"([^"]+)"', line)
            for name in found:
                names.setdefault(name, found[0])
    return names


def read(host: str, name: str):
    path = os.path.join(host, name)
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return f.read()


def no_answer(why: str) -> int:
    sys.stderr.write(f"replay_smi: the corpus cannot answer this: {why}\n")
    return NO_ANSWER


def split_row(line: str, width: int, names: list) -> list:
    """A CSV row of ``width`` columns; a process name holding ", " is put back together."""
    cells = line.split(", ")
    extra = len(cells) - width
    if extra > 0:
        for merge in ("process_name", "name", "gpu_name"):
            if merge in names:
                k = names.index(merge)
                cells = cells[:k] + [", ".join(cells[k:k + extra + 1])] + cells[k + extra + 1:]
                break
    return cells


def answer_query(host: str, kind: str, spec: str, fmt: str, state: str, rows_host=None) -> int:
    listing_file = "help-query-gpu.txt" if kind == "gpu" else "help-query-compute-apps.txt"
    listing = read(host, listing_file)
    if listing is None and rows_host:
        listing = read(rows_host, listing_file)  # (a host without a compute-apps listing: the rows' own)
    aliases = listing_names(listing.decode()) if listing is not None else None
    asked = [f.strip() for f in spec.split(",")]
    for field in asked:
        if aliases is not None and field not in aliases:
            sys.stdout.write(f'Field "{field}" is not a valid field to query.\n\n')
            return 2
    base = "query-gpu" if kind == "gpu" else "query-compute-apps"
    host = rows_host or host
    data = read(host, f"{base}.{state}.csv") or read(host, f"{base}.csv")
    if data is None:
        return no_answer(f"no {base} capture for {os.path.basename(host)}")
    lines = data.decode().splitlines()
    if not lines:
        return no_answer(f"the {base} capture of {os.path.basename(host)} is empty")
    header = lines[0].split(", ")
    names, units = [], []
    for cell in header:
        m = _UNIT.match(cell)
        names.append(m.group(1) if m else cell)
        units.append(m.group(2) if m else None)
    columns = []
    for field in asked:
        wanted = {field}
        if aliases is not None:
            canonical = aliases[field]
            wanted |= {a for a, c in aliases.items() if c == canonical}
        where = [i for i, n in enumerate(names) if n in wanted]
        if not where:
            return no_answer(f"the {base} capture of {os.path.basename(host)} has no column {field}")
        columns.append(where[0])
    parts = [p.strip() for p in fmt.split(",")]
    if "csv" not in parts:
        return no_answer(f"--format={fmt}")
    out = []
    if "noheader" not in parts:
        out.append(", ".join(header[i] for i in columns))
    for line in lines[1:]:
        if not line.strip():
            continue
        cells = split_row(line, len(header), names)
        row = []
        for i in columns:
            cell = cells[i]
            if "nounits" in parts and units[i] and cell.endswith(" " + units[i]):
                cell = cell[:-len(units[i]) - 1]
            row.append(cell)
        out.append(", ".join(row))
    sys.stdout.write("".join(line + "\n" for line in out))
    return 0


def main(argv) -> int:
    host = os.environ["FIELD_SMI_HOST"]
    state = os.environ.get("FIELD_SMI_STATE", "idle")
    log = os.environ.get("FIELD_SMI_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(argv) + "\n")
    if argv in (["--help-query-gpu"], ["--help-query-compute-apps"]):
        if os.environ.get("FIELD_SMI_NO_HELP") == "1":
            sys.stdout.write("Unknown Error\n")
            return 255
        data = read(host, "help-query-gpu.txt" if argv[0] == "--help-query-gpu" else "help-query-compute-apps.txt")
        if data is None:
            return no_answer(f"no listing for {argv[0]}")
        sys.stdout.buffer.write(data)
        return 0
    if sorted(argv) in (["-q", "-x"], ["--query", "--xml-format"]):
        data = read(host, "q.xml")
        if data is None:
            return no_answer("no -q -x capture")
        sys.stdout.buffer.write(data)
        return 0
    spec = fmt = None
    kind = None
    for arg in argv:
        if arg.startswith("--query-gpu="):
            kind, spec = "gpu", arg.split("=", 1)[1]
        elif arg.startswith("--query-compute-apps="):
            kind, spec = "app", arg.split("=", 1)[1]
        elif arg.startswith("--format="):
            fmt = arg.split("=", 1)[1]
        else:
            return no_answer(f"the option {arg}")
    if kind is None or fmt is None:
        return no_answer(" ".join(argv))
    return answer_query(host, kind, spec, fmt, state, os.environ.get("FIELD_SMI_ROWS") or None)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
