"""sglfleet: one command for every stage. Each subcommand hands its arguments to the stage's own entry point
(the `main` of python -m sglfleet.STAGE); the parsing, the output and the exit codes are the stage's:
0 pass / done, 1 a check failed, 2 bad input.

    sglfleet validate ARGS          python -m sglfleet.validation run ARGS     (make validate)
    sglfleet record-baseline ARGS   python -m sglfleet.validation record-baseline ARGS
    sglfleet check-text ARGS        python -m sglfleet.validation check-text ARGS
    sglfleet sweep ARGS             python -m sglfleet.validation sweep ARGS
    sglfleet deploy ARGS            python -m sglfleet.flow deploy ARGS        (--check: the plan, nothing changed)
    sglfleet main | demo ARGS       python -m sglfleet.flow main | demo ARGS
    sglfleet render ARGS            python -m sglfleet.rollout render ARGS     (also rollback, status, router)
    sglfleet loadtest ARGS          python -m sglfleet.loadtests run ARGS      (also capacity, loadtest-ui)
    sglfleet image ACTION ARGS      python -m sglfleet.images ACTION ARGS      (build, inspect, targets)
    sglfleet patches ACTION ARGS    python -m sglfleet.patches ACTION ARGS     (check, apply, show)
    sglfleet collections ACTION     python -m sglfleet.rollout.collections ACTION (install, check)

`sglfleet COMMAND --help` prints the stage's own help.
"""

from __future__ import annotations

import importlib
import sys

from sglfleet.pipeline.errors import EXIT_OK, EXIT_USAGE

# command -> (module whose main() runs it, the arguments put before the user's)
COMMANDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "validate": ("sglfleet.validation.__main__", ("run",)),
    "record-baseline": ("sglfleet.validation.__main__", ("record-baseline",)),
    "check-text": ("sglfleet.validation.__main__", ("check-text",)),
    "sweep": ("sglfleet.validation.__main__", ("sweep",)),
    "deploy": ("sglfleet.flow.__main__", ("deploy",)),
    "main": ("sglfleet.flow.__main__", ("main",)),
    "demo": ("sglfleet.flow.__main__", ("demo",)),
    "render": ("sglfleet.rollout.__main__", ("render",)),
    "rollback": ("sglfleet.rollout.__main__", ("rollback",)),
    "status": ("sglfleet.rollout.__main__", ("status",)),
    "router": ("sglfleet.rollout.__main__", ("router",)),
    "loadtest": ("sglfleet.loadtests.__main__", ("run",)),
    "capacity": ("sglfleet.loadtests.__main__", ("capacity",)),
    "loadtest-ui": ("sglfleet.loadtests.__main__", ("ui",)),
    "image": ("sglfleet.images.__main__", ()),
    "patches": ("sglfleet.patches.__main__", ()),
    "collections": ("sglfleet.rollout.collections", ()),
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] in (["-h"], ["--help"], ["help"]):
        print((__doc__ or "").strip())
        return EXIT_OK
    if not args or args[0] not in COMMANDS:
        what = f"unknown command '{args[0]}'" if args else "no command"
        print(f"error: {what}: one of {', '.join(COMMANDS)} (sglfleet --help)", file=sys.stderr)
        return EXIT_USAGE
    name, rest = args[0], args[1:]
    module, prefix = COMMANDS[name]
    entry = importlib.import_module(module).main
    return int(entry([*prefix, *rest]) or 0)


if __name__ == "__main__":
    sys.exit(main())
