"""The ``dihal`` command line: one entry point, one sub-command module per stage.

Each module in :data:`COMMANDS` defines ``register(subparsers)``, which adds its sub-command
with a ``func(args) -> int`` default. A refusal (:class:`dihal_fast.errors.DihalError`: bad paths, bad values) is
one clear line on stderr with exit status 2; an environment failure (``OSError`` or ``DihalIOError``: disk full, no
permission, a read-only file system) is one line with exit status 1; a closed stdout (``dihal info | head``) ends
the command quietly with status 0. Anything else is a bug and shows its traceback; ``DIHAL_DEBUG=1`` also shows
the traceback of a refusal. Options are never abbreviated (``--layer`` is not ``--layers``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys

from dihal_fast._version import __version__
from dihal_fast.common.deepspeed_banner import DEEPSPEED_BANNER, DEEPSPEED_LOGGER
from dihal_fast.cpu_malloc import configure_malloc
from dihal_fast.cpu_threads import configure_openmp, govern_threads
from dihal_fast.errors import DihalError

configure_openmp()  # the command's own process, before torch or the compiled core loads libgomp

# Sub-command modules, in the order they appear in --help.
COMMANDS = ["info", "backbone", "generate", "locate", "replace", "hcdlm", "evaluate", "sweep", "demo"]
# The (sub-)commands whose --out is a run directory: a busy one is refused before the parser is built, which
# imports the stages (torch, transformers). tests/test_rundir.py keeps this in step with the parsers' --out help.
RUN_DIRECTORY_COMMANDS = ("replace", "train", "locate", "sweep", "demo", "evaluate", "hcdlm train", "backbone train")


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line (``dihal locate: error: ... (see dihal locate --help)``), exit status 2; the
    sub-command parsers are of the same class (argparse creates them with the parent's). No option may be
    abbreviated: ``--layer 3`` beside a ``--layers`` option is refused, not read as ``--layers 3``."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


class _LibraryLogToStderr(logging.Filter):
    """Sends a library logger's records to stderr instead of its own handlers: DeepSpeed's logger prints to
    stdout ("Setting accelerator to CPU"), which must hold the command's output alone (``dihal replace``'s
    JSON line). A logger's filters outlive the handlers the library adds when it is imported later.

    Records starting with one of ``dropped`` are not shown at all: DeepSpeed's CPU banner, which its import logs
    also where DeepSpeed is not used (``save_pretrained`` imports it through accelerate's ``unwrap_model``
    whenever it is installed), is dropped unless the command runs with ``--deepspeed``."""

    dropped: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self.handler = logging.StreamHandler(sys.stderr)
        self.handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith(self.dropped):
            return False
        self.handler.stream = sys.stderr  # the stderr of now (a redirection, a test capture); no flush of the old
        self.handler.handle(record)
        return False


STDOUT_LOGGERS = (DEEPSPEED_LOGGER,)  # libraries whose logger writes to stdout


def keep_stdout_for_output() -> None:
    """Route the :data:`STDOUT_LOGGERS` to stderr (once per logger)."""
    for name in STDOUT_LOGGERS:
        target = logging.getLogger(name)
        if not any(isinstance(f, _LibraryLogToStderr) for f in target.filters):
            target.addFilter(_LibraryLogToStderr())


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="dihal",
        description="Geometry-guided diffusion inside pretrained language models (DiHAL) and HC-DLM.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dihal_fast {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"dihal_fast.cli.{name}").register(subparsers)
    _accept_local_rank(parser)
    return parser


class _LocalRank(argparse.Action):
    """``--local_rank=N`` / ``--local-rank N``: sets ``LOCAL_RANK`` while parsing (see :func:`set_local_rank`)."""

    def __call__(self, parser, namespace, value, option_string=None):
        from dihal_fast.common.launch import set_local_rank

        try:
            set_local_rank(value)
        except ValueError as exc:
            parser.error(str(exc))


def _accept_local_rank(parser: argparse.ArgumentParser, seen: set[int] | None = None) -> None:
    """Add ``--local_rank`` to ``parser`` and every (sub-)command below it: the ``deepspeed`` launcher and the old
    ``torch.distributed.launch`` put it before the sub-command, users sometimes after it."""
    seen = set() if seen is None else seen
    if id(parser) in seen:  # an alias (train = replace) is the same parser
        return
    seen.add(id(parser))
    parser.add_argument(
        "--local_rank",
        "--local-rank",
        type=int,
        action=_LocalRank,
        default=argparse.SUPPRESS,
        metavar="N",
        help="this process's rank on its node, as the deepspeed launcher passes it "
        "(sets LOCAL_RANK; torchrun and srun set the environment instead)",
    )
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _accept_local_rank(child, seen)


def _chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The deepest (sub-)command parser that ``args`` selected (``dihal hcdlm train``'s for ``hcdlm train``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            child = action.choices.get(getattr(args, action.dest, None) or "")
            if child is not None:
                return _chosen_parser(child, args)
    return parser


def run_directory_out(argv: list[str]) -> tuple[str, str | None] | None:
    """``(command, --out)`` when ``argv`` names a command whose ``--out`` is a run directory, else None; read
    from the words alone, before the parser (and the stages it imports) exists."""
    if "-h" in argv or "--help" in argv:
        return None
    words: list[str] = []
    out = None
    tokens = iter(argv)
    for token in tokens:
        if token in ("--local-rank", "--local_rank"):
            next(tokens, None)
        elif token == "--out":
            out = next(tokens, None)
        elif token.startswith("--out="):
            out = token.removeprefix("--out=")
        elif not token.startswith("-") and len(words) < 2:
            words.append(token)
    named = [" ".join(words[:length]) for length in (1, 2) if len(words) >= length]
    return (words[0], out) if any(name in RUN_DIRECTORY_COMMANDS for name in named) else None


def main(argv: list[str] | None = None) -> int:
    """Run one ``dihal`` command; a refusal or an environment failure is one line on stderr (``DIHAL_DEBUG=1``:
    its traceback too); a closed stdout ends it quietly with status 0."""
    from dihal_fast.common.progress import quiet_library_bars
    from dihal_fast.common.rundir import refuse_busy

    command = "dihal"
    try:
        quiet_library_bars()
        keep_stdout_for_output()
        configure_malloc()  # before the first large tensor
        early = run_directory_out(sys.argv[1:] if argv is None else argv)
        if early:  # a second writer stops here, in a fraction of a second, not after the heavy imports
            command = f"dihal {early[0]}"
            if early[1]:
                refuse_busy(early[1])
        threads = govern_threads()  # measures the other processes' load while the command loads
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra:  # refused by the (sub-)command they were given to, so that its --help is the one named
            _chosen_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
        command = f"dihal {args.command}"
        _LibraryLogToStderr.dropped = () if getattr(args, "deepspeed", None) else (DEEPSPEED_BANNER,)
        threads.poll()
        logging.basicConfig(
            level=logging.DEBUG if args.verbose else logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            datefmt="%H:%M:%S",
        )
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a full disk or a closed pipe on stdout is reported here, not at exit
        return code
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM inside a run directory (it names how to continue)
        print(f"{command}: {exc or 'interrupted'}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `dihal info | head -c0`: the reader has what it wanted
        with contextlib.suppress(OSError, ValueError):  # Python must not flush the gone stdout again at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (DihalError, OSError) as exc:
        if os.environ.get("DIHAL_DEBUG", "") not in ("", "0"):
            raise
        return _report(command, exc)


def _report(command: str, exc: BaseException) -> int:
    """Print ``exc`` as one line; exit status 2 for bad input (a missing input file included), 1 for the
    environment (disk full, no permission, a read-only file system)."""
    print(f"{command}: error: {' '.join(str(exc).split()) or type(exc).__name__}", file=sys.stderr)
    environment = isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError)
    return 1 if environment else 2


if __name__ == "__main__":
    sys.exit(main())
