"""The public API: derived names, error families, and a cheap import for Spark's workers."""

from __future__ import annotations

import ast
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pyspark_abs
from pyspark_abs import errors
from tests.support.docs import code_blocks

INIT = Path(pyspark_abs.__file__)

FAMILIES = (
    errors.DefinitionError,
    errors.UserCodeError,
    errors.ProtocolError,
    errors.SnapshotError,
    errors.StorageIOError,
)

NAMES_BEFORE_THE_FAMILIES = [
    "AbsConfig",
    "AbsError",
    "AlignmentError",
    "BackEdge",
    "Clock",
    "CommitError",
    "ConfigError",
    "DeltaSink",
    "DeltaSource",
    "EpochStatus",
    "Fault",
    "FaultAction",
    "FaultStep",
    "FencingError",
    "FileSource",
    "InjectedFault",
    "InvalidTimeoutError",
    "KafkaSource",
    "KeyGroupContext",
    "KeyGroupResult",
    "KeyState",
    "ManifestError",
    "Operator",
    "OperatorDefinitionError",
    "OperatorError",
    "Pipeline",
    "PipelineMismatchError",
    "PipelineQuery",
    "PrecommitFileError",
    "Quiescence",
    "QuiescenceError",
    "ReplayDivergedError",
    "SchemaMismatchError",
    "SnapshotDamagedError",
    "SnapshotInfo",
    "SnapshotListener",
    "SnapshotNotFoundError",
    "SnapshotRootError",
    "Snapshots",
    "SourceError",
    "StateEncodingError",
    "StateNotSetError",
    "StateTooLargeError",
    "StorageError",
    "TableSchemaError",
    "TimeoutMode",
    "local_session",
    "operator",
    "restore",
    "rollback",
    "vectorized_operator",
    "write_state",
]
"""``pyspark_abs.__all__`` as it was listed by hand: every name must stay importable (the
errors and faults among them from the top level with a deprecation warning, for one release)."""


def _type_checking_imports() -> dict[str, set[str]]:
    tree = ast.parse(INIT.read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    found: dict[str, set[str]] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom)
        assert node.module is not None
        found.setdefault(node.module, set()).update(alias.name for alias in node.names)
    return found


def test_type_checkers_see_the_names_the_package_exports() -> None:
    declared = _type_checking_imports()
    assert declared == {module: set(names) for module, names in pyspark_abs._PUBLIC.items()}


def test_the_public_surface_is_the_guides_names_and_the_error_root() -> None:
    exported = set(pyspark_abs.__all__)
    assert len(exported) <= 46
    assert [n for n in exported if n.endswith("Error")] == ["AbsError"]
    assert not {"Fault", "FaultAction", "FaultStep"} & exported


@pytest.mark.parametrize(
    ("name", "home"), [("FencingError", errors), ("SnapshotNotFoundError", errors), ("Fault", None)]
)
def test_a_name_that_moved_still_imports_with_a_warning_naming_its_home(
    name: str, home: object
) -> None:
    moved = pyspark_abs._MOVED[name]
    with pytest.warns(DeprecationWarning, match=rf"import it from {moved} \(from {moved} import"):
        value = getattr(pyspark_abs, name)
    assert value is getattr(__import__(moved, fromlist=[name]), name)
    if home is not None:
        assert value is getattr(home, name)
    assert name not in vars(pyspark_abs), "a moved name must warn at every use, not only the first"


def test_no_subpackage_or_module_shadows_a_public_name() -> None:
    """Importing ``pyspark_abs.x`` sets the package's attribute ``x`` to that module."""
    children = {info.name for info in pkgutil.iter_modules(pyspark_abs.__path__)}
    assert children & set(pyspark_abs.__all__) == set()
    assert children & set(pyspark_abs._MOVED) == set()


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Piepline'"):
        _ = pyspark_abs.Piepline


def test_every_name_the_package_exported_before_still_resolves() -> None:
    for name in NAMES_BEFORE_THE_FAMILIES:
        if name in pyspark_abs._MOVED:
            with pytest.warns(DeprecationWarning, match=f"pyspark_abs.{name} is deprecated"):
                assert getattr(pyspark_abs, name) is not None
        else:
            assert name in pyspark_abs.__all__


def test_every_exported_name_resolves() -> None:
    for name in pyspark_abs.__all__:
        assert getattr(pyspark_abs, name) is not None
        if name in pyspark_abs._LAZY:
            module = __import__(pyspark_abs._LAZY[name], fromlist=[name])
            assert getattr(pyspark_abs, name) is getattr(module, name)


@pytest.mark.parametrize("cls", errors.error_classes()[1:], ids=lambda c: c.__name__)
def test_every_error_belongs_to_one_family(cls: type[errors.AbsError]) -> None:
    if cls in FAMILIES:
        assert cls.__bases__ == (errors.AbsError,)
    else:
        assert len([f for f in FAMILIES if issubclass(cls, f)]) == 1


def test_errors_keep_their_builtin_bases() -> None:
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.OperatorDefinitionError, ValueError)
    assert issubclass(errors.InvalidTimeoutError, ValueError)
    assert issubclass(errors.SchemaMismatchError, TypeError)
    assert issubclass(errors.StateNotSetError, LookupError)
    assert issubclass(errors.SnapshotNotFoundError, LookupError)
    assert issubclass(errors.PrecommitFileError, errors.AlignmentError)
    assert issubclass(errors.ConcurrentWriteError, errors.SnapshotRootError)


def test_importing_the_sources_does_not_load_pandas() -> None:
    probe = "import sys, pyspark_abs.sources; print('pandas' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        cwd=INIT.parents[1],
    )
    assert result.stdout.strip() == "False"


def _readme_imports() -> set[str]:
    names: set[str] = set()
    for block in code_blocks():
        try:
            tree = ast.parse(block)
        except SyntaxError:  # a sketch with elisions: its one-line imports still count
            for line in re.findall(r"^\s*from pyspark_abs import ([^(\n]+)$", block, re.M):
                names.update(name.strip() for name in line.split(","))
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "pyspark_abs":
                names.update(alias.name for alias in node.names)
    return names


def test_every_name_the_readme_imports_exists() -> None:
    names = _readme_imports()
    assert {"validate", "compact", "vacuum", "Job", "rollback"} <= names
    missing = sorted(n for n in names if n not in pyspark_abs.__all__ and n != "testing")
    assert missing == []
