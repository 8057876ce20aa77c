"""What the lean command paths (``restore_options``, ``verify_call``) share: a plain value class,
and options declared once for both a hand parser and a click command.

Their command-line objects compare and print by their ``__slots__``, as a frozen dataclass
would, without importing ``dataclasses`` (with ``inspect`` behind it, ~10 ms of a call's
start-up). A lean command declares its options as :class:`Option` rows: :func:`read_options`
reads the usual command lines from them without click, and the command's click twin builds
its options (help, types, usage errors) from the same rows
(:func:`~receivewal.commands.clickoptions.click_option`). An option several commands share is
one row of :mod:`receivewal.commands.catalog`, which a command takes as it is or
:meth:`Option.but` its own help.
"""

from __future__ import annotations

TYPE_CHECKING = False  # restore's lean path loads no typing (~10 ms): see receivewal.restore
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

# The kinds of an option's value, which say how it is read (a command's reader and click type
# of a kind hold its bounds).
FLAG = "flag"  # no value
COUNT = "count"  # a whole number
TEXT = "text"
PATH = "path"  # a directory or a bucket URL: click must not find it to be a file
KEYFILE = "keyfile"  # an identity file's path: missing or unreadable, the command's error


class Plain:
    """Equality and repr by ``__slots__`` (set by the subclass); not hashable."""

    __slots__: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(
            getattr(self, k) == getattr(other, k) for k in self.__slots__)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"{type(self).__name__}({fields})"


class Option(Plain):
    """One option of a lean command, declared once.

    ``dest`` names its value; ``names`` are its spellings (a two-letter one also takes its
    value attached, ``-j4``, a long one as ``--jobs=4``); ``kind`` is :data:`FLAG` or the
    command's word for what its value is (the hand parser reads the value by it, the click
    command types it by it); ``metavar`` and ``help`` are for ``--help``; ``env`` is the
    variable that gives the value when the command line does not (empty: unset, as click
    has it), ``required`` whether a value must come from one or the other, ``maximum`` the
    largest a counted value may be.
    """

    __slots__ = ("dest", "env", "help", "kind", "maximum", "metavar", "names", "required")

    def __init__(self, dest: str, names: tuple[str, ...], kind: str, *, help: str,
                 metavar: str = "", env: str | None = None, required: bool = False,
                 maximum: int = 0) -> None:
        self.dest, self.names, self.kind = dest, names, kind
        self.metavar, self.help = metavar, help
        self.env, self.required, self.maximum = env, required, maximum

    def but(self, **changes: object) -> Option:
        """This option as one command has it: ``changes`` to its fields (its help, metavar,
        variable or destination there); its spellings stay the declared ones (only
        :meth:`long_only` leaves one out)."""
        other = Option.__new__(Option)
        for name in self.__slots__:
            setattr(other, name, changes.pop(name, getattr(self, name)))
        if changes:
            raise TypeError(f"an Option has no {', '.join(changes)}")
        return other

    def named(self) -> str:
        """How a message names it: its long spelling, and its variable when it has one."""
        return self.names[-1] + (f" (or {self.env})" if self.env else "")

    def long_only(self, **changes: object) -> Option:
        """:meth:`but`, without the short spelling (a command whose own ``-d`` means
        another thing)."""
        names = tuple(name for name in self.names if name.startswith("--"))
        return self.but(names=names, **changes)


def read_options(args: Sequence[str], options: Sequence[Option],
                 readers: Mapping[str, Callable[[str], object]],
                 environ: Mapping[str, str] | None = None,
                 ) -> tuple[dict[str, object], list[str]] | None:
    """The values (by ``dest``; a flag False when not given, another option absent unless
    its ``env`` variable in ``environ`` gives it) and the arguments of the command line
    ``args``, in any order, the last of a repeated option winning; None for a command line to
    leave to click: an unknown option, a value missing or starting with ``-`` (click may read
    it otherwise), a required option given nowhere, or a value that ``readers[kind]`` refuses
    by returning None (click says why)."""
    by_name = {name: option for option in options for name in option.names}
    values: dict[str, object] = {o.dest: False for o in options if o.kind == FLAG}
    texts: dict[str, str] = {o.dest: environ[o.env] for o in options
                             if environ is not None and o.env and environ.get(o.env)}
    arguments = []
    i = 0
    while i < len(args):
        arg = args[i]
        option = by_name.get(arg)
        name, _, inline = arg.partition("=")
        attached = by_name.get(arg[:2]) if len(arg) > 2 else None
        if option is not None and option.kind == FLAG:
            values[option.dest] = True
        elif option is not None:
            if i + 1 >= len(args) or args[i + 1].startswith("-"):
                return None  # click says what is missing (or reads the value its own way)
            texts[option.dest] = args[i + 1]
            i += 1
        elif name.startswith("--") and inline and not inline.startswith("-") \
                and (option := by_name.get(name)) is not None and option.kind != FLAG:
            texts[option.dest] = inline
        elif attached is not None and attached.kind != FLAG:
            texts[attached.dest] = arg[2:]
        elif arg.startswith("-") or not arg:
            return None
        else:
            arguments.append(arg)
        i += 1
    if any(o.required and o.dest not in texts for o in options):
        return None
    kinds = {o.dest: o.kind for o in options}
    for dest, text in texts.items():
        value = readers[kinds[dest]](text)
        if value is None:
            return None
        values[dest] = value
    return values, arguments
