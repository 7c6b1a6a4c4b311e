"""``python -m cbpo allocate|credit|reward|methods|sandbox|doctor`` — inspect a batch, list the methods, run the
sandbox or check a study before launching it."""
from __future__ import annotations

import argparse
import json
import sys

# Input and output of each JSON contract, shown by its --help (docs/cli.md gives examples).
ALLOCATE_SCHEMA = """input (one JSON object):
  {"budget": M, "config": {w, d_min, top_j, alpha, gamma, kappa, rho_path, rho_node, b_node, b_path,
   candidates}  (optional, CBPO's defaults otherwise),
   "problems": [{"id": any (optional), "vocab_size": V,
                 "parents": [{"id": any (optional), "token_entropy": [H_t >= 0 per model token],
                              "tool_boundaries": [model-token positions] (optional)}]}]}
output: {"problems": [{"id", "branches": [{"parent": parent id or index, "at": b}], "fill": n}]}
  branches in the order Algorithm 1 draws them (Eqs. 5-10); fill: independent rollouts that fill
  the remaining slots."""
CREDIT_SCHEMA = """input (one JSON object per line, a problem's rollouts in any order):
  {"id": str|int, "problem": str|int, "kind": "parent"|"branch"|"fill", "reward": r,
   "n_tokens": model tokens, "parent": a parent's id (branches), "at": b (branches)}
output: one line per input line, in input order:
  {"id", "advantage": [A_t per model token], "loss_mask": [0|1 per model token]}  (Eqs. 13-19)"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sandbox"]:
        from cbpo.tools.sandbox import cli

        return cli(argv[1:])
    if argv[:1] == ["doctor"]:
        from cbpo.doctor import cli

        return cli(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m cbpo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    raw = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser("allocate", help="Stage-1 branch plan (Eqs. 5-10) for IN.json", epilog=ALLOCATE_SCHEMA,
                       formatter_class=raw)
    p.add_argument("input", help="JSON file, or - for stdin")
    p = sub.add_parser("credit", help="Stage-2 token advantages (Eqs. 13-19) for IN.jsonl", epilog=CREDIT_SCHEMA,
                       formatter_class=raw)
    p.add_argument("input", help="JSONL file, or - for stdin")
    p.add_argument("--config", default=None, help="JSON object of CBPOConfig overrides, e.g. '{\"eta\": 0}'")
    sub.add_parser("sandbox", help="run FILE.py in the Python sandbox (see --help there)")
    sub.add_parser("doctor", help="check a study's data, models, search, judge, SLURM, disk and engines (see --help there)")
    p = sub.add_parser("reward", help="outcome reward (Eq. 12) of each {response, gold, domain} line of IN.jsonl")
    p.add_argument("input", help="JSONL file, or - for stdin")
    p = sub.add_parser("methods", help="the registered methods: name, paper, what is implemented, knobs")
    p.add_argument("--json", action="store_true", help="a JSON list of {name, display_name, paper, group, trains, knobs}")
    args = parser.parse_args(argv)
    if args.command == "methods":
        from cbpo.registry import methods_json, methods_table

        print(methods_json() if args.json else methods_table())
        return 0

    from cbpo import cli

    try:
        if args.command == "allocate":
            print(json.dumps(cli.allocate(cli._read_json(args.input))))
        elif args.command == "reward":
            for line in cli.reward(cli.read_jsonl(args.input)):
                sys.stdout.write(json.dumps(line) + "\n")
        else:
            overrides = cli.parse_json(args.config, "--config") if args.config else None
            for line in cli.credit(cli.read_jsonl(args.input), overrides):
                sys.stdout.write(json.dumps(line) + "\n")
    except cli.InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
