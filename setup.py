"""Build the optional C extension ``aprof._ctracer`` (the Python tracer's hot path).

Metadata lives in pyproject.toml; this file only adds the extension. If the
compiler is missing or the build fails, installation still succeeds: aprof
then runs its tracer through the pure-Python twin
(``aprof/_core/_tracer_py.py``) and warns once when a tracer starts.
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class optional_build_ext(build_ext):
    """build_ext that reports a failed build instead of failing the install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, missing headers, ...
            self._skipped(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._skipped(exc)

    def _skipped(self, exc: BaseException) -> None:
        print(
            f"WARNING: aprof's C extension was not built ({type(exc).__name__}: {exc}); "
            "aprof will use its pure-Python tracer",
            file=sys.stderr,
        )


setup(
    ext_modules=[
        Extension(
            "aprof._ctracer",
            sources=[
                "aprof/_ctracer.c",
                "aprof/_cranges.c",
                "aprof/_cevents.c",
                "aprof/_ctasks.c",
                "aprof/_csampler.c",
                "aprof/_cblocks.c",
                "aprof/_cmemory.c",
            ],
            depends=["aprof/_cext.h"],
            extra_compile_args=["-O2", "-std=c11"] if sys.platform != "win32" else [],
            extra_link_args=["-pthread"] if sys.platform != "win32" else [],
            optional=True,
        )
    ],
    cmdclass={"build_ext": optional_build_ext},
)
