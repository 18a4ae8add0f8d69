"""``python -m utils COMMAND ...``: the course's commands (the tools live in ``utils.course``).

    python -m utils run [LESSON ...] [--preset NAME]     run lessons with papermill, print what they showed
    python -m utils labs build|check|validate            the student editions (labs/) and reference solutions
    python -m utils grade SUBMISSIONS --lab NN           grade a class's executed labs
    python -m utils handout --out DIR [--withhold NN]    a student repository without the withheld answers
    python -m utils rehearse --preset t4-16g ...         execute the lessons on a GPU preset's code path, on a CPU
    python -m utils twins measure --preset 24g ...       measure GPU presets with architecture twins
    python -m utils tiny build|eval                      build (or re-measure) the embedded tiny model
    python -m utils readme [--check]                     rewrite the README's lesson table from the lessons

``python -m utils COMMAND --help`` describes each.
"""
import importlib
import sys

COMMANDS = {"run": "run", "labs": "labs", "grade": "grade", "handout": "handout", "rehearse": "rehearsal",
            "twins": "twins", "tiny": "tiny",
            "readme": "readme"}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print(__doc__.strip())
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nerror: unknown command {argv[0]!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
            return 2
        return 0
    try:
        module = importlib.import_module(f"utils.course.{COMMANDS[argv[0]]}")
    except ModuleNotFoundError as e:
        if e.name != f"utils.course.{COMMANDS[argv[0]]}":   # the command is here, something it imports is not
            raise
        print(f"error: `{argv[0]}` is an instructor's command and is not part of this handout", file=sys.stderr)
        return 2
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
