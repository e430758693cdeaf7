"""Build pvwire's compiled modules in place: `python scripts/build_ext.py` (make does it).

`--sanitize DIR` (`make sanitize`) builds them instead with AddressSanitizer and UBSan, into a
copy of the package in DIR, which the sanitizer run puts first on PYTHONPATH; the checkout's
modules are left alone.

`pvwire.upstream._pvaingest` (PVA monitors, server/pvwire/upstream/_pvaingest.cpp) is compiled
against the pvxs and EPICS headers that the installed `pvxslibs` and `epicscorelibs` wheels ship,
with their compiler settings (`epicscorelibs.config`: pvxs is built with the pre-C++11 string
ABI, which our code must share), and linked to their libraries; setuptools' build_ext supplies
Python's own flags and file name. `pvwire.core._journal` (the history journal's writer,
server/pvwire/core/_journal.c), `pvwire.core._tick` (the tick's routing and splicing,
server/pvwire/core/_tick.c) and `pvwire.core._fanout` (the tick's fan-out to pvws clients,
server/pvwire/core/_fanout.c) need nothing but Python. Nothing is done for a module newer than
its source, this script and the libraries it links (replaced wheels bring newer library files).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

# Importing epicscorelibs.config probes the toolchain through setuptools_dso, which logs a
# warning on the root logger about patching that probe's compiler object (not the one below).
logging.getLogger().setLevel(logging.ERROR)

import epicscorelibs.config  # noqa: E402
import epicscorelibs.path  # noqa: E402
import numpy  # noqa: E402
import pvxslibs.path  # noqa: E402
from setuptools import Distribution, Extension  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "server" / "pvwire" / "upstream" / "_pvaingest.cpp"
JOURNAL_SOURCE = ROOT / "server" / "pvwire" / "core" / "_journal.c"
TICK_SOURCE = ROOT / "server" / "pvwire" / "core" / "_tick.c"
FANOUT_SOURCE = ROOT / "server" / "pvwire" / "core" / "_fanout.c"
SLOTS_HEADER = ROOT / "server" / "pvwire" / "core" / "_slots.h"


# Any error stops the process (no recovery), with a stack that names the lines: -O1 and frame
# pointers, as the sanitizers' documentation advises.
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


def extension(sanitize: bool = False) -> Extension:
    pvxs_lib = str(Path(pvxslibs.path.__file__).parent / "lib")
    epics_lib = epicscorelibs.path.lib_path
    return Extension(
        "pvwire.upstream._pvaingest",
        sources=[str(SOURCE.relative_to(ROOT))],
        include_dirs=[
            pvxslibs.path.include_path,
            epicscorelibs.path.include_path,
            numpy.get_include(),
        ],
        define_macros=epicscorelibs.config.get_config_var("CPPFLAGS"),
        library_dirs=[pvxs_lib, epics_lib],
        libraries=["pvxs", "Com"],
        depends=[str(Path(pvxs_lib) / "libpvxs.so"), str(Path(epics_lib) / "libCom.so")],
        # Found by path at load time; `import p4p` (which the module does first) has already
        # loaded the same libraries, which the loader then reuses.
        runtime_library_dirs=[pvxs_lib, epics_lib],
        extra_compile_args=["-std=c++17", "-Wall", "-Wno-missing-field-initializers"]
        + ([*SANITIZE, "-O1", "-g"] if sanitize else ["-O2", "-g0"]),
        extra_link_args=SANITIZE if sanitize else [],
        language="c++",
    )


def c_extension(name: str, source: Path, sanitize: bool = False) -> Extension:
    """A module of one C file that needs nothing but Python."""
    return Extension(
        name,
        sources=[str(source.relative_to(ROOT))],
        depends=[str(SLOTS_HEADER)],  # what both modules include
        extra_compile_args=["-Wall", "-Wextra"]
        + ([*SANITIZE, "-O1", "-g"] if sanitize else ["-O2", "-g0"]),
        extra_link_args=SANITIZE if sanitize else [],
    )


def extensions(sanitize: bool = False) -> list[Extension]:
    """Every compiled module of pvwire."""
    return [
        extension(sanitize),
        c_extension("pvwire.core._journal", JOURNAL_SOURCE, sanitize),
        c_extension("pvwire.core._tick", TICK_SOURCE, sanitize),
        c_extension("pvwire.core._fanout", FANOUT_SOURCE, sanitize),
    ]


def up_to_date(ext: Extension) -> bool:
    """Whether the built module is newer than its source, this script and the libraries."""
    target = ROOT / "server" / (ext.name.replace(".", "/") + sysconfig.get_config_var("EXT_SUFFIX"))
    inputs = [ROOT / f for f in ext.sources] + [Path(f) for f in ext.depends] + [Path(__file__)]
    return target.exists() and all(f.stat().st_mtime < target.stat().st_mtime for f in inputs)


def build(ext: Extension, into: Path | None) -> None:
    """Compile `ext` in place, or into the package tree under `into`."""
    with tempfile.TemporaryDirectory(prefix="pvwire-build-") as tmp:
        dist = Distribution({"ext_modules": [ext], "package_dir": {"": "server"}})
        cmd = dist.get_command_obj("build_ext")
        cmd.inplace = into is None  # type: ignore[attr-defined]
        cmd.build_temp = tmp  # type: ignore[attr-defined]
        cmd.build_lib = str(into or tmp)  # type: ignore[attr-defined]
        dist.run_command("build_ext")


def sanitized(into: Path) -> None:
    """A copy of the package in `into`, its modules built with the sanitizers (every time)."""
    shutil.rmtree(into, ignore_errors=True)
    ignore = shutil.ignore_patterns(
        "_pvaingest*.so", "_journal*.so", "_tick*.so", "_fanout*.so", "__pycache__"
    )
    shutil.copytree(ROOT / "server" / "pvwire", into / "pvwire", ignore=ignore)
    for ext in extensions(sanitize=True):
        build(ext, into)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sanitize", type=Path, metavar="DIR", help="ASan+UBSan build in DIR")
    args = parser.parse_args()
    if args.sanitize is not None:
        sanitized(args.sanitize.resolve())
        return 0
    for ext in extensions():
        if not up_to_date(ext):
            build(ext, None)
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)  # setuptools takes the source paths relative to the project
    sys.exit(main())
