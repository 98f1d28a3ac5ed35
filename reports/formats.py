"""The report formats: one registered row each, read by ``gradcheck run``, ``gradcheck report`` and pytest.

A :class:`Format` is everything the rest of gradcheck knows about a kind of
report: its name (the flags ``--NAME PATH`` of ``gradcheck run`` and
``gradcheck report``, ``--gradcheck-NAME PATH`` of the pytest plugin), the
suffix of its files, the example file name an error suggests when a folder is
given as the path, the help line of its flag, and its renderer, a function of
a :class:`gradcheck.results.RunResult` returning the report's text.

The renderer may be named as ``"module:function"``: it is imported when the
first report of that format is rendered, so a registered format costs no
import until it is used.  ``gradcheck.app.output`` renders and writes every
format through this registry, and the CLI builds one flag per registered
format, so ``register`` is the whole of adding one (``docs/decisions.md``,
"Adding a report format").
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass

# A name becomes a flag (--NAME) and an argparse destination (NAME with "_" for "-").
_NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")


@dataclass(frozen=True)
class Format:
    """One kind of report, as the CLI, the pytest plugin and ``gradcheck.app.output`` see it."""

    name: str  # "html": the flags --html and --gradcheck-html
    suffix: str  # ".html": the suffix of its files
    render: Callable | str  # RunResult -> str, or "module:function" naming it (imported on first use)
    example: str = ""  # the file name an error suggests for a folder given as the path; "report" + suffix by default
    help: str = ""  # the help line of its flag; "write the NAME report here" by default

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(f"report format name {self.name!r}: use lowercase letters and digits, words joined "
                             "by '-' (it becomes the flag --NAME), e.g. 'csv' or 'leaf-table'")
        if not isinstance(self.suffix, str) or not re.fullmatch(r"\.[A-Za-z0-9.]+", self.suffix):
            raise ValueError(f"report format {self.name!r}: suffix={self.suffix!r} is not a file suffix; give one "
                             "with its dot, e.g. '.csv'")
        if isinstance(self.render, str):
            if not re.fullmatch(r"[\w.]+:\w+", self.render):
                raise ValueError(f"report format {self.name!r}: render={self.render!r} names no function; give a "
                                 "callable or 'package.module:function'")
        elif not callable(self.render):
            raise ValueError(f"report format {self.name!r}: render={self.render!r} is not callable; give a function "
                             "of a RunResult returning the report's text, or 'package.module:function'")
        if not self.example:
            object.__setattr__(self, "example", "report" + self.suffix)
        if not self.help:
            object.__setattr__(self, "help", f"write the {self.name} report here")

    @property
    def dest(self) -> str:
        """The attribute of parsed arguments that holds this format's path (``--leaf-table`` -> ``leaf_table``)."""
        return self.name.replace("-", "_")

    def renderer(self) -> Callable:
        """The render function (imported now if it was given by name)."""
        if callable(self.render):
            return self.render
        module, _, attr = self.render.partition(":")
        return getattr(importlib.import_module(module), attr)


_REGISTRY: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Add a report format; the CLI's flags and ``gradcheck.app.output`` see it from now on."""
    if fmt.name in _REGISTRY:
        raise ValueError(f"a report format named {fmt.name!r} is already registered; unregister({fmt.name!r}) it "
                         "first, or give the new one another name")
    _REGISTRY[fmt.name] = fmt
    return fmt


def unregister(name: str) -> Format:
    """Remove the format named ``name`` (a ValueError naming the registered ones when there is none)."""
    if name not in _REGISTRY:
        raise ValueError(f"no report format named {name!r}; registered: {', '.join(_REGISTRY)}")
    return _REGISTRY.pop(name)


def registered() -> tuple[Format, ...]:
    """The registered formats, in the order registered (the order of the CLI's flags)."""
    return tuple(_REGISTRY.values())


def names() -> tuple[str, ...]:
    """The registered formats' names."""
    return tuple(_REGISTRY)


def get(name: str) -> Format:
    """The format named ``name``, or a ValueError that lists the registered ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown report format {name!r}; choose from {', '.join(_REGISTRY)} (a new format is "
                         "registered with gradcheck.reports.formats.register)") from None


# ---------------------------------------------------------------- the built-in formats, in the CLI's order
register(Format("html", ".html", "gradcheck.reports.html:render_html"))
register(Format("json", ".json", "gradcheck.reports:render_json", example="results.json"))
register(Format("junit", ".xml", "gradcheck.reports.junit:render_junit", example="junit.xml"))
register(Format("markdown", ".md", "gradcheck.reports.markdown:render_markdown", example="summary.md"))
