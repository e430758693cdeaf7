"""setuptools' build of pvwire's compiled modules, for wheels (`pip wheel .`, the Dockerfile): the
PVA monitor module and the history journal's writer.

The extensions' settings are scripts/build_ext.py's, which `make ext` uses to build the same
modules in place. They are read only when build_ext runs: making metadata (`pip install
--dry-run`, scripts/runtime_lock.py) needs neither the EPICS wheels nor a compiler. An editable
install (`make venv`) compiles nothing; `make ext` builds the modules in place for it.

Build with the EPICS wheels that will run the module (`pip wheel --no-build-isolation` after
installing requirements-runtime.lock, as the Dockerfile does): pvxs has no stable ABI across
minor versions, and pyproject's bounds only hold the wheel to the pvxslibs minor it was built with.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
MODULES = {
    "pvwire.upstream._pvaingest": "server/pvwire/upstream/_pvaingest.cpp",
    "pvwire.core._journal": "server/pvwire/core/_journal.c",
    "pvwire.core._tick": "server/pvwire/core/_tick.c",
    "pvwire.core._fanout": "server/pvwire/core/_fanout.c",
}


# What scripts/build_ext.py decides; setuptools keeps its own bookkeeping on the Extension.
SETTINGS = (
    "sources",
    "include_dirs",
    "define_macros",
    "library_dirs",
    "libraries",
    "runtime_library_dirs",
    "extra_compile_args",
    "extra_link_args",
    "depends",
    "language",
)


def _configure(ext: Extension) -> None:
    """Give `ext` the settings of scripts/build_ext.py (include and library paths, flags)."""
    spec = importlib.util.spec_from_file_location(
        "_pvwire_build_ext", ROOT / "scripts/build_ext.py"
    )
    assert spec is not None and spec.loader is not None
    script: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    configured = next(e for e in script.extensions() if e.name == ext.name)
    for setting in SETTINGS:
        setattr(ext, setting, getattr(configured, setting))


class BuildExt(build_ext):
    def run(self) -> None:
        if getattr(self, "editable_mode", False):
            modules = ", ".join(MODULES)
            self.announce(f"{modules}: not compiled for an editable install (`make ext`)", 2)
            return
        for ext in self.extensions:
            _configure(ext)
        super().run()


setup(
    # Named here so that setuptools tags the wheel for this platform; its settings come at build.
    ext_modules=[Extension(name, sources=[source]) for name, source in MODULES.items()],
    cmdclass={"build_ext": BuildExt},
)
