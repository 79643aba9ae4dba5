"""Write (and optionally execute) the notebooks from their Jupytext sources.

    python notebooks/make_notebooks.py             # rewrite every .ipynb from its .py, without outputs
    python notebooks/make_notebooks.py --execute   # rewrite and execute them, saving outputs
    python notebooks/make_notebooks.py --execute deterministic_xent   # just one

Each notebook's source is a plain Python file in Jupytext's percent format
(``notebooks/<name>.py``: ``# %%`` starts a code cell, ``# %% [markdown]`` a
markdown cell whose lines are comments), so linters, reviews and duplicate
finders read the code as code. Edit the ``.py``, then regenerate with
``--execute`` (run it with the Python of ``.venv``: the kernel runs the
launching interpreter, see :func:`execute`). ``tests/test_notebooks.py``
executes each notebook with :func:`execute` and checks that every committed
``.ipynb`` has exactly its source's cells.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import jupytext
import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))
NOTEBOOKS = ("validate_correctness", "deterministic_xent")
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def source_path(name: str) -> str:
    return os.path.join(HERE, f"{name}.py")


def build(name: str):
    """The notebook ``name`` read from its percent-format source, without outputs."""
    if name not in NOTEBOOKS:
        raise ValueError(f"name: expected one of {', '.join(NOTEBOOKS)}, got {name!r}")
    nb = jupytext.read(source_path(name), fmt="py:percent")
    nb.metadata.pop("jupytext", None)                # a plain notebook: no pairing information
    for index, cell in enumerate(nb.cells):          # stable ids: regenerating changes no id
        cell["id"] = f"cell-{index:02d}"
        cell.metadata.clear()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def execute(nb, cwd: str = HERE, timeout: int = 600):
    """Execute ``nb`` in place, in a kernel running this interpreter, with ``cwd`` as working directory.

    The kernel is ipykernel's built-in ``python3`` spec, whose command is
    ``sys.executable -m ipykernel_launcher``: no ``ipykernel install`` is needed,
    and no kernelspec installed elsewhere (user or system Jupyter directories)
    can substitute another interpreter.
    """
    from jupyter_client import AsyncKernelManager
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient import NotebookClient
    from traitlets import default

    class ThisInterpreterKernelManager(AsyncKernelManager):
        @default("kernel_spec_manager")
        def _only_the_native_spec(self):
            return KernelSpecManager(kernel_dirs=[], ensure_native_kernel=True)

    # The client creates the kernel manager, so it also shuts the kernel down.
    client = NotebookClient(nb, kernel_manager_class=ThisInterpreterKernelManager,
                            kernel_name=KERNELSPEC["name"], timeout=timeout, record_timing=False,
                            resources={"metadata": {"path": cwd}})
    client.execute()
    return nb


def _write_atomic(nb, path: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".notebook-", suffix=".ipynb")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            nbformat.write(nb, handle)
        os.replace(tmp, path)  # replaces a symlink itself, never writes through it
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--execute", action="store_true", help="execute and save the outputs")
    parser.add_argument("names", nargs="*", metavar="name",
                        help=f"which notebooks, among {', '.join(NOTEBOOKS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(NOTEBOOKS))
    if unknown:
        parser.error(f"unknown notebook(s) {unknown}; choose from {list(NOTEBOOKS)}")
    for name in args.names or list(NOTEBOOKS):
        nb = build(name)
        if args.execute:
            print(f"executing {name} ...", flush=True)
            execute(nb)
        path = os.path.join(HERE, f"{name}.ipynb")
        nbformat.validate(nb)
        _write_atomic(nb, path)
        print(f"wrote {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
