"""Each option is declared once, each constant defined once.

An option several commands share is a row of :mod:`receivewal.commands.catalog`; a command takes
the row (with its own help) and never spells the option again. The source of
``receivewal/commands/`` is read: a spelling (``-D``, ``--identity``) given to a declaration
(``click.option``, ``Option``, ``option``) outside the catalog must be given to no other
declaration. And no two modules of ``receivewal/`` define the same text constant (the same name
and value: ``IDENTITY_ENV = "RECEIVEWAL_IDENTITY"``), nor a ``RECEIVEWAL_*`` variable's name
under two names. No server needed.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from receivewal.commands import catalog
from receivewal.commands.logical_options import LogicalOptions
from receivewal.commands.options import StreamOptions, declared_options
from receivewal.commands.plain import Option

PACKAGE = Path(__file__).resolve().parent.parent / "receivewal"
COMMANDS = PACKAGE / "commands"
CATALOG = COMMANDS / "catalog.py"
DECLARERS = {"option", "Option"}  # click.option, plain.Option, options.option

#: Spellings that name different options in different commands, as the programs they mirror
#: have them; each is declared once per meaning.
HOMONYMS = {
    "-n": "stream's --no-loop (pg_receivewal's -n) and cleanup's --dry-run (pg_archivecleanup's)",
    "-P": "backup's and recover's --progress (pg_basebackup's -P) and logical's --publication",
    "-d": "stream's --dbname (pg_receivewal's -d) and cleanup's -d (pg_archivecleanup's debug)",
    "--to": "where a command's result goes: recover's new data directory, apply's target "
            "database",
}


def _spellings(node: ast.Call) -> list[str]:
    """The spellings a declaration's positional arguments give (``"-D"``, ``("-D",
    "--directory")``, an on/off pair ``"--x/--no-x"``)."""
    texts: list[str] = []
    for arg in node.args:
        items = arg.elts if isinstance(arg, ast.Tuple) else [arg]
        texts += [item.value for item in items
                  if isinstance(item, ast.Constant) and isinstance(item.value, str)]
    return [name for text in texts for name in text.split("/")
            if name.startswith("-") and " " not in name and len(name) > 1]


def _declarer(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else \
        func.id if isinstance(func, ast.Name) else None


def declarations(paths: list[Path]) -> dict[str, list[str]]:
    """Where each spelling is declared: ``module:line`` per declaration."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and _declarer(node) in DECLARERS:
                for name in _spellings(node):
                    found[name].append(f"{path.name}:{node.lineno}")
    return found


def declared_twice(commands: Path) -> dict[str, list[str]]:
    """The spellings declared in more than one place of ``commands`` outside the catalog, or
    both there and in the catalog."""
    outside = declarations(sorted(p for p in commands.glob("*.py") if p.name != CATALOG.name))
    inside = declarations([commands / CATALOG.name])
    return {name: places + inside.get(name, [])
            for name, places in outside.items()
            if name not in HOMONYMS and (len(places) > 1 or name in inside)}


def _text_constants(tree: ast.Module) -> list[tuple[str, str]]:
    """The upper-case names a module's top level binds to a text (``A = "a"``, ``A: str =
    "a"``, ``A, B = "a", "b"``)."""
    found = []
    for node in tree.body:
        pairs: list[tuple[ast.expr, ast.expr | None]] = \
            [(t, node.value) for t in node.targets] if isinstance(node, ast.Assign) else \
            [(node.target, node.value)] if isinstance(node, ast.AnnAssign) else []
        for target, value in pairs:
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                pairs += list(zip(target.elts, value.elts, strict=False))
            elif isinstance(target, ast.Name) and target.id.isupper() \
                    and isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.append((target.id, value.value))
    return found


def constants_twice(package: Path) -> dict[str, list[str]]:
    """Text constants defined at module level in two modules (the same name and value), and
    ``RECEIVEWAL_*`` names defined under two names."""
    pairs: dict[tuple[str, str], list[str]] = defaultdict(list)
    variables: dict[str, set[str]] = defaultdict(set)
    for path in sorted(package.rglob("*.py")):
        module = str(path.relative_to(package.parent))
        for name, text in _text_constants(ast.parse(path.read_text(), str(path))):
            pairs[name, text].append(module)
            if text.startswith("RECEIVEWAL_"):
                variables[text].add(name)
    twice = {f"{name} = {value!r}": modules for (name, value), modules in pairs.items()
             if len(modules) > 1}
    twice |= {value: sorted(names) for value, names in variables.items() if len(names) > 1}
    return twice


def test_no_option_is_declared_twice() -> None:
    """A spelling is declared once outside the catalog, and not also in it: a shared option
    is the catalog's row, which each command takes."""
    assert declared_twice(COMMANDS) == {}


def test_the_rule_sees_a_second_declaration(tmp_path: Path) -> None:
    """The reading finds each form of declaration: a click option, an Option row, a stream
    field, and a spelling repeated beside the catalog's."""
    (tmp_path / "catalog.py").write_text('DIRECTORY = Option("directory", ("-D", "--directory"),'
                                         ' "path")\n')
    (tmp_path / "one.py").write_text('@click.option("--identity", help="a key file")\n'
                                     'def f(): ...\n')
    (tmp_path / "two.py").write_text('X = Option("identity", ("--identity",), "keyfile")\n'
                                     'Y = option(None, "--directory", "-D", help="h")\n'
                                     'Z = option(True, "--x/--no-x", help="h")\n')
    assert set(declared_twice(tmp_path)) == {"--identity", "--directory", "-D"}


def test_no_constant_is_defined_twice() -> None:
    """No two modules define the same text constant, nor one variable's name under two
    names."""
    assert constants_twice(PACKAGE) == {}


def test_the_catalog_rows_are_options() -> None:
    """Every upper-case name of the catalog is a row or a variable's name; a row's variable is
    the one ``stream`` derives from its long spelling, where ``stream`` takes it."""
    rows = {name: value for name, value in vars(catalog).items()
            if name.isupper() and isinstance(value, Option)}
    assert rows
    taken = {spec.names: spec.env_var for cls in (StreamOptions, LogicalOptions)
             for _, spec, _ in declared_options(cls)}
    for row in rows.values():
        if row.names in taken:
            assert taken[row.names] == row.env, row.names


def test_the_rule_sees_a_constant_defined_twice(tmp_path: Path) -> None:
    """Plain, annotated and unpacked definitions are read, and a variable's name under two
    names."""
    package = tmp_path / "receivewal"
    package.mkdir()
    (package / "a.py").write_text('KEYFILE = "keyfile"\nIDENTITY_ENV = "RECEIVEWAL_IDENTITY"\n')
    (package / "b.py").write_text('FLAG, KEYFILE = "flag", "keyfile"\n'
                                  'ENV: str = "RECEIVEWAL_IDENTITY"\nlower = "keyfile"\n')
    assert constants_twice(package) == {
        "KEYFILE = 'keyfile'": ["receivewal/a.py", "receivewal/b.py"],
        "RECEIVEWAL_IDENTITY": ["ENV", "IDENTITY_ENV"]}
