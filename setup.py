"""Packaging. ``build_ext`` compiles the cross-entropy custom op against the
TensorFlow installed in the running interpreter (install with
``--no-build-isolation``); the recipe lives in ``equivtool/ops/_build.py`` so
that ``equivtool build-ops`` uses the very same one."""

import importlib.util
import os

from setuptools import Extension, setup
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
    ext_modules=[Extension("equivtool.ops._xent_ops", sources=[])],
    cmdclass={"build_ext": BuildTensorFlowOps},
)
