"""The ctypes structs of flexjit/_lib.py against include/flexjit.h: a C program
compiled with the header prints every struct's size and every field's
offset, and the Python layouts must match (a field added to the header and
not to _lib.py fails here); the enum values _lib.py mirrors, likewise."""
import ctypes
import os
import re
import shutil
import subprocess

import pytest

from conftest import REPO
from flexjit import _lib


def _c_program():
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "flexjit.h"',
             "int main(void) {"]
    for cname, py in _lib.STRUCTS.items():
        lines.append(f'  printf("{cname} %zu\\n", sizeof({cname}));')
        for field, _ in py._fields_:
            lines.append(f'  printf("{cname}.{field} %zu\\n", offsetof({cname}, {field}));')
    for name in _lib.CONSTANTS:
        lines.append(f'  printf("{name} %d\\n", (int){name});')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def test_struct_layouts_match_the_header(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    probe = tmp_path / "probe.c"
    probe.write_text("#include <dlpack/dlpack.h>\n")
    if subprocess.run([cc, "-fsyntax-only", str(probe)]).returncode != 0:
        pytest.skip("dlpack/dlpack.h is not installed (Debian: libdlpack-dev)")
    src = tmp_path / "layout.c"
    src.write_text(_c_program())
    exe = tmp_path / "layout"
    subprocess.run([cc, str(src), "-I", os.path.join(REPO, "include"), "-o", str(exe)],
                   check=True)
    got = dict(line.rsplit(" ", 1) for line in
               subprocess.run([str(exe)], check=True, stdout=subprocess.PIPE,
                              text=True).stdout.splitlines())
    for cname, py in _lib.STRUCTS.items():
        assert int(got[cname]) == ctypes.sizeof(py), cname
        for field, _ in py._fields_:
            assert int(got[f"{cname}.{field}"]) == getattr(py, field).offset, \
                f"{cname}.{field}"
    for name, value in _lib.CONSTANTS.items():
        assert int(got[name]) == value, name


def test_every_struct_field_is_mirrored():
    """Field counts: a header struct with a field _lib.py lacks would still
    match in offsets up to that field, so count them in the header too."""
    header = open(os.path.join(REPO, "include", "flexjit.h")).read()
    for cname, py in _lib.STRUCTS.items():
        if cname == "DLTensor":
            continue
        body = header.split(f"typedef struct {cname} {{", 1)[1].split(f"}} {cname};", 1)[0]
        code = re.sub(r"/\*.*?\*/", " ", body, flags=re.S)
        names = sum(len(d.split(",")) for d in code.split(";") if d.strip())
        assert names == len(py._fields_), f"{cname}: {names} fields in the header"
