"""The one compiled part of pglab: the scanner of pgbench's per-transaction logs (src/pglab/workloads/_txscan.pyx).
Everything else about the package is in pyproject.toml."""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(ext_modules=cythonize([Extension("pglab.workloads._txscan", ["src/pglab/workloads/_txscan.pyx"],
                                       extra_compile_args=["-O2"])]))
