"""The project has an `operator/` folder; nothing of ours may shadow the standard `operator`."""

import operator
import sys
import sysconfig
from pathlib import Path


def test_operator_is_the_standard_library_module() -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    origin = Path(operator.__file__).resolve() if getattr(operator, "__file__", None) else None
    # CPython may load `operator` from the frozen/builtin set; then it has no file but is still real.
    if origin is not None:
        assert stdlib in origin.parents, f"`operator` was imported from {origin}"
    assert operator.itemgetter(1)([0, 42]) == 42
    assert "operator" in sys.stdlib_module_names
