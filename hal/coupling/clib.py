"""libembodyrl_link, the coupling link for C and Fortran models: where its sources are, and a build.

The sources (``c/``: the library, its header ``embodyrl_link.h`` and the Fortran module
``embodyrl_link.f90``) install with the package, so a model's build can take them from
``C_SOURCES``; :func:`build` runs CMake on them (needs cmake, libzmq, msgpack-c, libsodium and a
CBLAS; the Fortran module when a Fortran compiler is found), and :func:`compile_program` builds a
model's program against the result.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

C_SOURCES = Path(__file__).parent / "c"
TOOLS = ("cmake", "pkg-config", "cc")


class CBuildError(RuntimeError):
    """The library could not be built here; the message says what was missing or what failed."""


def build(build_dir: str | Path, fortran: bool = True) -> Path:
    """Configure and build the library in ``build_dir`` (again only what changed); returns the
    directory holding ``libembodyrl_link.so`` (and ``embodyrl_link.mod`` with Fortran)."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise CBuildError(f"{', '.join(missing)} not found (Debian: cmake pkg-config gcc)")
    build_dir = Path(build_dir)
    configure = ["cmake", "-S", str(C_SOURCES), "-B", str(build_dir)]
    if not fortran:
        configure.append("-DCMAKE_Fortran_COMPILER=")
    for command in (configure, ["cmake", "--build", str(build_dir)]):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise CBuildError(f"{' '.join(command)} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return build_dir


def compile_program(source: str | Path, build_dir: str | Path, output: str | Path, compiler: str = "cc",
                    flags: tuple[str, ...] = ("-O2",)) -> Path:
    """Compile and link ``source`` (C, or Fortran with a Fortran ``compiler``) against the library
    :func:`build` made in ``build_dir``: its header and Fortran module found, the library found at
    run time (rpath). Returns ``output``."""
    build_dir = Path(build_dir).resolve()
    command = [compiler, *flags, f"-I{C_SOURCES}", f"-I{build_dir}", "-o", str(output), str(source),
               f"-L{build_dir}", "-lembodyrl_link", f"-Wl,-rpath,{build_dir}"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise CBuildError(f"{' '.join(command)} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return Path(output)
