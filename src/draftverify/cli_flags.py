"""Flags built from declared dataclass fields (options/declare.option). The method-option flags of `generate`,
`serve` and `bench`: a command wrapped in declared_flags() takes its own parameters plus one flag per declared
option, and receives their values as one dict; typer reads the signature whenever it builds the command, so a
drafter registered later (a plug-in, a test) gets its flags with no edit here. The train commands: a command
wrapped in settings_command(cls) takes one flag per field of cls and receives one cls instance."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable, Collection

import typer

from .cli_help import flag
from .options import SharedOptions, all_fields
from .options.checks import methods_reading
from .options.declare import declaration, declared, default_of, field_types

DRAFTER_PANEL = "Method options (each drafter's own)"
SHARED_PANEL = "BiLD and verifier options"


def declared_parameters(shared: bool = True, exclude: Collection[str] = ()) -> list[inspect.Parameter]:
    """One keyword parameter per declared field (SharedOptions' too when shared), named as the field."""
    params = []
    for name, (cls, f) in all_fields().items():
        opt = declaration(f)
        is_shared = cls is SharedOptions
        if opt is None or name in exclude or (is_shared and not shared):
            continue
        help_text = opt.help_text()
        if not is_shared:
            help_text += f" Methods: {', '.join(methods_reading(name)) or 'none'}."
        if opt.zoo is not None:
            help_text += f" Default with --zoo: the entry's {opt.zoo}, if it has one."
        annotation = (str | None) if opt.parse is not None or opt.zoo is not None else field_types(cls)[name]
        default = None if opt.parse is not None else default_of(f)  # parsed options: None is the declared default
        settings = {"callback": _file_path} if opt.zoo is not None else {}  # a path read raw: "" is not "."
        panel = SHARED_PANEL if is_shared else DRAFTER_PANEL
        info = flag(default, opt.flag, help=help_text, rich_help_panel=panel, **settings)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=annotation))
    return params


def _file_path(context: typer.Context, parameter: typer.CallbackParam, value: str | None) -> Path | None:
    """A file option's value as given: a Path, or a usage error (exit 2) for an empty one, which Path would read as
    the current folder."""
    if value is None:
        return None
    if not value.strip():
        raise typer.BadParameter("is empty: give a file or folder path")
    return Path(value)


class DeclaredFlags:
    """A typer command: the wrapped function's parameters (less `options`) plus the declared flags; called with
    all of them, it passes the declared ones' values (parsed) to the function as `options`."""

    def __init__(self, func: Callable[..., Any], shared: bool, exclude: Collection[str]):
        self.func, self.shared, self.exclude = func, shared, tuple(exclude)
        self.__name__, self.__doc__, self.__module__ = func.__name__, func.__doc__, func.__module__

    @property
    def __signature__(self) -> inspect.Signature:
        own = inspect.signature(self.func, eval_str=True)
        kept = [p for p in own.parameters.values() if p.name != "options"]
        return own.replace(parameters=kept + declared_parameters(self.shared, self.exclude))

    @property
    def __annotations__(self) -> dict[str, Any]:  # typer reads type hints as well as the signature
        return {p.name: p.annotation for p in self.__signature__.parameters.values()}

    def __call__(self, **kwargs: Any) -> Any:
        names = {p.name for p in declared_parameters(self.shared, self.exclude)}
        options = {name: kwargs.pop(name) for name in list(kwargs) if name in names}
        return self.func(**kwargs, options=options)  # parsed by the command (parse_values), where errors exit 2


def declared_flags(shared: bool = True, exclude: Collection[str] = ()) -> Callable[[Callable[..., Any]], DeclaredFlags]:
    """Decorator (under @app.command()): add the declared options' flags to a command; shared=False leaves out
    SharedOptions' (bench sweeps those as grids of its own), exclude leaves out fields by name."""
    return lambda func: DeclaredFlags(func, shared, exclude)


def field_parameters(cls: type, leave_out: Collection[str] = ()) -> list[inspect.Parameter]:
    """One keyword parameter per declared field of dataclass cls (less those named in leave_out), named as the
    field, with its default and help."""
    types = field_types(cls)
    return [
        inspect.Parameter(
            f.name,
            inspect.Parameter.KEYWORD_ONLY,
            annotation=types[f.name],
            default=flag(default_of(f), opt.flag, help=opt.help_text()),
        )
        for f, opt in declared(cls)
        if f.name not in leave_out
    ]


class SettingsCommand:
    """A typer command whose flags are the fields of a settings dataclass; called with them, it passes the
    function one instance, and, to a function that takes a second parameter, the names of the fields whose flags
    the command line gave (a value equal to the default included: what was typed, not what differs)."""

    def __init__(self, func: Callable[..., Any], cls: type, leave_out: Collection[str]):
        self.func, self.cls = func, cls
        self.passes_given = len(inspect.signature(func).parameters) == 2
        self.__name__, self.__doc__, self.__module__ = func.__name__, func.__doc__, func.__module__
        context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
        self.__signature__ = inspect.Signature([context, *field_parameters(cls, leave_out)])
        self.__annotations__ = {p.name: p.annotation for p in self.__signature__.parameters.values()}

    def __call__(self, ctx: typer.Context, **kwargs: Any) -> Any:
        settings = self.cls(**kwargs)
        if not self.passes_given:
            return self.func(settings)
        given = frozenset(name for name in kwargs if _from_command_line(ctx, name))
        return self.func(settings, given)


def _from_command_line(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name != "DEFAULT"


def settings_command(cls: type, leave_out: Collection[str] = ()) -> Callable[[Callable[[Any], Any]], SettingsCommand]:
    """Decorator (under @app.command()): the command's flags are cls's declared fields, less those named in
    leave_out (a recipe's options, or a command's flags dataclass: see train/shared_flags.py)."""
    return lambda func: SettingsCommand(func, cls, leave_out)
