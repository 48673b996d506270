"""benchmarks/matrix_table.py: the RESULTS.md target table from a bench_matrix.sh run."""
from scripts import load_script


def _table():
    return load_script("benchmarks/matrix_table.py", "matrix_table")


RUN = """W3   MLP fwd + loss, b128     913.4 us (889.9 us)     1.039 ms (996.7 us)
  W2 >= 1.0x OpenBLAS: {w2}x {w2v}
  W3 >= 1.2x best peer: {w3}x {w3v}
  W10 >= 1.2x best peer: 1.50x MET
notes:
  W3 rlxc: first call 0.16 s; 3% of 88 calls on 1 thread
"""


def _write(d, name, w2, w3):
    v = lambda r, need: "MET" if r >= need else "MISSED"  # noqa: E731
    (d / name).write_text(RUN.format(w2=f"{w2:.2f}", w2v=v(w2, 1.0), w3=f"{w3:.2f}",
                                     w3v=v(w3, 1.2)))


def test_rows_cells_and_misses(tmp_path):
    _write(tmp_path, "native-1.txt", 1.09, 1.20)
    _write(tmp_path, "native-2.txt", 1.06, 1.21)
    _write(tmp_path, "znver3-1.txt", 0.96, 1.12)
    (tmp_path / "w7.txt").write_text("  W7 cold <= JAX: rlxc/jax 0.38 MET\n")  # not a build
    mt = _table()
    rows, rounds = mt.collect(str(tmp_path))
    assert rounds == 2
    assert rows["W3 >= 1.2x best peer"] == {"native": {1: "1.20", 2: "1.21"},
                                            "znver3": {1: "1.12*"}}
    text = mt.table(rows, rounds)
    lines = text.splitlines()
    # numeric workload order (W10 after W3), a missing round and build show as "-"
    assert [ln.split(" >=")[0] for ln in lines[2:5]] == ["| W2", "| W3", "| W10"]
    assert lines[3] == "| W3 >= 1.2x best peer | 1.20 / 1.21 | 1.12* / - | - / - |"
    assert text.endswith("2 of 9 checks missed (*)")


def test_an_empty_dir_is_an_error(tmp_path, capsys):
    assert _table().main([str(tmp_path)]) == 1
    assert "no compare.py runs" in capsys.readouterr().err
