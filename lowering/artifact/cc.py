"""The system C compiler, as the artifact writer uses it: glue, blob, link, header check.

    glue.c ──cc -c──► glue.o      blob.s ──cc -c──► blob.o
    kernel objects + glue.o + blob.o ──cc -shared (version script)──► libNAME.so

The version script exports the documented ABI (the glue's `API` functions)
and makes every other symbol local: kernel entry points, the OpenMP thread
setting, sgemm.  Two rlxc libraries in one process therefore never bind to
each other's internals (a call through the PLT would otherwise resolve to the
first library loaded).  Every failure raises RuntimeError with the command
and cc's own message.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

__all__ = ["find_cc", "run_cc", "compile_glue", "assemble", "link_library", "version_script",
           "check_header"]

GLUE_FLAGS = ["-std=c99", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror",
              "-Wno-unused-function"]


def find_cc(cpu: str = "native") -> str:
    """The C compiler for `cpu`'s target: $CC/cc for this machine, the target's cross
    compiler (lowering/cpu/target.TARGETS) for another architecture."""
    from rlxc.lowering.cpu.target import cc_for

    return cc_for(cpu)


def run_cc(args: list, what: str) -> None:
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: `{' '.join(args)}` failed (exit {proc.returncode}):\n"
                           f"{proc.stderr.strip() or proc.stdout.strip()}")


def compile_glue(c_path: str, include_dir: str, o_path: str, cpu: str = "native") -> bytes:
    """cc -c the glue strictly (warnings are errors); returns the object bytes."""
    run_cc([find_cc(cpu), *GLUE_FLAGS, "-c", c_path, "-I", include_dir, "-o", o_path],
           "compiling the C glue")
    with open(o_path, "rb") as f:
        return f.read()


def assemble(s_path: str, o_path: str, cpu: str = "native") -> bytes:
    run_cc([find_cc(cpu), "-c", s_path, "-o", o_path], "assembling the baked params")
    with open(o_path, "rb") as f:
        return f.read()


def version_script(exports: list[str]) -> str:
    """A GNU ld version script exporting `exports` and hiding everything else."""
    bad = [s for s in exports if not s.isidentifier()]
    if bad or not exports:
        raise ValueError(f"version script: exports must be C identifiers, got {bad or exports}")
    body = "".join(f"    {s};\n" for s in exports)
    return f"{{\n  global:\n{body}  local:\n    *;\n}};\n"


def link_library(objects: list[bytes], out_path: str, exports: list[str],
                 cpu: str = "native") -> str:
    """Link object bytes into the shared library `out_path` exporting only `exports`
    (libgomp through -fopenmp; libm is recorded only where used); written atomically
    by lowering/cpu/target.link_shared, with the version script added."""
    from rlxc.lowering.cpu.target import link_shared

    with tempfile.TemporaryDirectory(prefix="rlxc-exports-") as tmp:
        vs = os.path.join(tmp, "exports.map")
        with open(vs, "w") as f:
            f.write(version_script(exports))
        return link_shared(objects, out_path, ("gomp",), cpu,
                           extra_flags=(f"-Wl,--version-script={vs}",))


def check_header(header_path: str, lang: str = "c") -> None:
    """Compile the header alone strictly (c: -std=c99, c++: -std=c++17); raises on warnings."""
    d = os.path.dirname(os.path.abspath(header_path))
    if lang == "c":
        cmd = [find_cc(), "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only",
               "-x", "c", "-"]
    else:
        cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
        cmd = [cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only",
               "-x", "c++", "-"]
    src = f'#include "{os.path.basename(header_path)}"\nint main(void) {{ return 0; }}\n'
    proc = subprocess.run(cmd + ["-I", d], input=src, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"header {header_path} does not compile as {lang}:\n{proc.stderr}")
