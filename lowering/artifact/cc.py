"""The system C compiler, as the artifact writer uses it: glue, blob, link, header check.

    glue.c ──cc -c──► glue.o      blob.s ──cc -c──► blob.o
    kernel objects + glue.o + blob.o ──cc -shared (version script)──► libNAME.so

Every failure raises RuntimeError with the command and cc's own message.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

__all__ = ["find_cc", "run_cc", "compile_glue", "assemble", "link_library", "check_header"]

GLUE_FLAGS = ["-std=c99", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-Werror",
              "-Wno-unused-function"]


def find_cc() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise RuntimeError("no C compiler found (looked for $CC, cc, gcc, clang)")
    return cc


def run_cc(args: list, what: str) -> None:
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: `{' '.join(args)}` failed (exit {proc.returncode}):\n"
                           f"{proc.stderr.strip() or proc.stdout.strip()}")


def compile_glue(c_path: str, include_dir: str, o_path: str) -> bytes:
    """cc -c the glue strictly (warnings are errors); returns the object bytes."""
    run_cc([find_cc(), *GLUE_FLAGS, "-c", c_path, "-I", include_dir, "-o", o_path],
           "compiling the C glue")
    with open(o_path, "rb") as f:
        return f.read()


def assemble(s_path: str, o_path: str) -> bytes:
    run_cc([find_cc(), "-c", s_path, "-o", o_path], "assembling the baked params")
    with open(o_path, "rb") as f:
        return f.read()


def link_library(objects: list[bytes], out_path: str) -> str:
    """Link object bytes into the shared library `out_path` (libgomp, libm); atomic."""
    from rlxc.lowering.cpu.target import link_shared

    return link_shared(objects, out_path)


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
