"""Write the dotted symbol names listed in TensorFlow's API golden files.

TensorFlow checks its public API against golden files, one per module or
class (``tensorflow/tools/api/golden/v1/tensorflow.saved_model.loader.pbtxt``:
``path: "tensorflow.saved_model.loader"`` and its ``member`` /
``member_method`` names). This tool turns such files into one dotted name a
line (``tensorflow.saved_model.loader.load``), the data that
``tests/test_exported_recorder.py`` checks the recorder's ``tf.`` names against.

    git -C tensorflow archive v1.15.0 tensorflow/tools/api/golden/v1 | tar -x -C /tmp/golden
    python tools/tf1_api_symbols.py /tmp/golden/tensorflow/tools/api/golden/v1 > tests/data/tf115_api_symbols.txt

Only names are written (no argspecs, no text of the files).
"""

from __future__ import annotations

import argparse
import os
import re
import sys

_PATH = re.compile(r'^path:\s*"([^"]+)"', re.M)
_MEMBER = re.compile(r'^\s*member(?:_method)?\s*\{\s*name:\s*"([^"]+)"', re.M)


def symbols(text: str) -> list:
    """The module or class path of one golden file, and path.member for each member."""
    found = _PATH.search(text)
    if found is None:
        return []
    path = found.group(1)
    return [path] + [f"{path}.{name}" for name in _MEMBER.findall(text)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("golden_dir", help="a tensorflow/tools/api/golden/v1 folder")
    args = parser.parse_args(argv)
    names = set()
    for name in sorted(os.listdir(args.golden_dir)):
        if name.endswith(".pbtxt"):
            with open(os.path.join(args.golden_dir, name), encoding="utf-8") as f:
                names.update(symbols(f.read()))
    sys.stdout.write("".join(f"{n}\n" for n in sorted(names)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
