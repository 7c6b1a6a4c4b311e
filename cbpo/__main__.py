"""``python -m cbpo allocate|credit|sandbox`` — inspect a batch or run the sandbox."""
from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sandbox"]:
        from cbpo.tools.sandbox import cli

        return cli(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m cbpo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("allocate", help="Stage-1 branch plan (Eqs. 5-10) for IN.json")
    p.add_argument("input", help="JSON file, or - for stdin")
    p = sub.add_parser("credit", help="Stage-2 token advantages (Eqs. 13-19) for IN.jsonl")
    p.add_argument("input", help="JSONL file, or - for stdin")
    p.add_argument("--config", default=None, help="JSON object of CBPOConfig overrides, e.g. '{\"eta\": 0}'")
    sub.add_parser("sandbox", help="run FILE.py in the Python sandbox (see --help there)")
    args = parser.parse_args(argv)

    from cbpo import cli

    try:
        if args.command == "allocate":
            print(json.dumps(cli.allocate(cli._read_json(args.input))))
        else:
            overrides = json.loads(args.config) if args.config else None
            if overrides is not None and not isinstance(overrides, dict):
                raise cli.InputError("--config must be a JSON object")
            for line in cli.credit(cli.read_jsonl(args.input), overrides):
                sys.stdout.write(json.dumps(line) + "\n")
    except (cli.InputError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
