"""The AOT artifact writer: libNAME.so + NAME.h + NAME.json + the NAME/ package.

    spec.py       ArtifactSpec / TrainSpec (plain data, built by rlxc/export.py)
    templates/    glue.c.in, header.h.in, package.py.in: the generated files, with holes
    template.py   the strict filler (@key@ holes, @if@/@else@/@end@ line sections)
    header.py, glue.py, package.py   the values each template needs
    metadata.py   NAME.json;  isa.py  the CPU features the code may use (asked of LLVM)
    cc.py         the system C compiler: glue, blob, link (version script), header check
    writer.py     build_artifact: the order of the steps and the atomic writes
    progress.py   the compile status line and per-stage timings
"""
