"""The target table of a bench_matrix.sh run: one row per compare.py target, one cell per
build with every round's ratio (peer median / rlxc median; * marks a miss), as in
RESULTS.md.  Usage: python benchmarks/matrix_table.py DIR (bench_matrix.sh's $OUT)."""
from __future__ import annotations

import os
import re
import sys

BUILDS = ("native", "znver3", "portable")
TARGET = re.compile(r"\s+(W\d+ .+?): ([\d.]+)x (MET|MISSED)$")
RUN = re.compile(r"(\w+)-(\d+)\.txt$")


def collect(out_dir: str) -> tuple[dict, int]:
    """{target: {build: {round: 'ratio' or 'ratio*'}}} and the number of rounds."""
    rows: dict = {}
    rounds = 0
    for name in sorted(os.listdir(out_dir)):
        m = RUN.match(name)
        if not m or m.group(1) not in BUILDS:
            continue
        build, r = m.group(1), int(m.group(2))
        rounds = max(rounds, r)
        with open(os.path.join(out_dir, name)) as f:
            for line in f:
                t = TARGET.match(line.rstrip("\n"))
                if t:
                    cell = t.group(2) + ("" if t.group(3) == "MET" else "*")
                    rows.setdefault(t.group(1), {}).setdefault(build, {})[r] = cell
    return rows, rounds


def table(rows: dict, rounds: int) -> str:
    order = sorted(rows, key=lambda k: (int(k.split()[0][1:]), k))
    lines = ["| target | " + " | ".join(f"{b} r1..r{rounds}" for b in BUILDS) + " |",
             "|---|" + "---|" * len(BUILDS)]
    for key in order:
        cells = [" / ".join(rows[key].get(b, {}).get(r, "-") for r in range(1, rounds + 1))
                 for b in BUILDS]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    misses = sum(c.endswith("*") for by in rows.values() for rs in by.values()
                 for c in rs.values())
    total = sum(len(rs) for by in rows.values() for rs in by.values())
    lines.append(f"\n{misses} of {total} checks missed (*)")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not os.path.isdir(argv[0]):
        print(__doc__, file=sys.stderr)
        return 2
    rows, rounds = collect(argv[0])
    if not rows:
        print(f"no compare.py runs (native-1.txt, ...) with targets in {argv[0]}",
              file=sys.stderr)
        return 1
    print(table(rows, rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
