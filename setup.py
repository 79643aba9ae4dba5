"""Packaging. ``build_ext`` compiles the cross-entropy custom op against the
TensorFlow installed in the running interpreter (install with
``--no-build-isolation``); the recipe lives in ``equivtool/ops/_build.py`` so
that ``equivtool build-ops`` uses the very same one.

The distribution ships the ``equivtool`` package, its op sources (the
repository's top-level ``custom_ops/``, installed as ``equivtool/ops/kernels``
package data) and the repository's ``examples/`` as ``equivtool.examples``,
so that ``equivtool demo`` runs from an installed package. In a source checkout the same files import as ``examples.*`` (the
tests, notebooks and benchmarks do); the examples import each other
relatively so that both names work."""

import importlib.util
import os

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_builder():
    path = os.path.join(HERE, "equivtool", "ops", "_build.py")
    spec = importlib.util.spec_from_file_location("_equivtool_ops_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildTensorFlowOps(build_ext):
    """Builds the op library with TensorFlow's own compile and link flags."""

    def build_extension(self, ext):
        builder = _load_builder()
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        builder.build_ops(output=target, verbose=self.verbose)


setup(
    packages=find_packages(include=["equivtool", "equivtool.*"])
    + ["equivtool.examples"]
    + [f"equivtool.examples.{name}" for name in find_packages(where="examples")]
    + ["equivtool.ops.kernels"],
    package_dir={"equivtool.examples": "examples", "equivtool.ops.kernels": "custom_ops"},
    ext_modules=[Extension("equivtool.ops._xent_ops", sources=[])],
    cmdclass={"build_ext": BuildTensorFlowOps},
)
