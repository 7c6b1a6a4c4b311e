"""``python -m cbpo.retriever``: build a retrieval index, serve it (docs/retriever.md).

    python -m cbpo.retriever index CORPUS.jsonl DIR [--kind bm25|dense]
    python -m cbpo.retriever serve DIR [--host 127.0.0.1] [--port 8000]
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from cbpo.retriever.index import KINDS, build_index
from cbpo.retriever.server import Limits, serve


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m cbpo.retriever", description=__doc__.split("\n\n")[0],
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(dest="command", required=True)

    index = commands.add_parser("index", help="build an index folder from a JSONL corpus")
    index.add_argument("corpus", type=Path, help='passages, one JSON object per line: {"id", "title", "text"} '
                       'or Search-R1\'s {"id", "contents"}')
    index.add_argument("folder", type=Path, help="the index folder (replaced whole when the build ends)")
    index.add_argument("--kind", choices=KINDS, default="bm25", help="bm25 (bm25s) or dense (MiniLM + FAISS); default bm25")
    index.add_argument("--name", help="the index's name in /health (default: the corpus file's stem)")
    index.add_argument("--faiss", choices=("auto", "flat", "hnsw"), default="auto",
                       help="dense only: exact (flat) or approximate (hnsw) search; auto: hnsw from 1M passages")
    index.add_argument("--model", help="dense only: a sentence-transformers folder (default: the shipped all-MiniLM-L6-v2)")

    run = commands.add_parser("serve", help="serve an index folder over Search-R1's /retrieve API")
    run.add_argument("folder", type=Path, help="an index folder (python -m cbpo.retriever index)")
    run.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    run.add_argument("--port", type=int, default=8000, help="0 takes a free port (default 8000)")
    for field in fields(Limits):
        run.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default,
                         help=f"{field.metadata['help']} (default {field.default})")
    run.add_argument("--lease-dir", type=Path, help="stop once no lease in this folder has been alive for --idle-exit seconds "
                     "(cbpo.retriever.lease: how the DAG's jobs share a server)")
    run.add_argument("--idle-exit", type=float, default=30.0, help="seconds without a live lease before it stops (default 30)")
    run.add_argument("--ready-file", type=Path, help="write {url, pid, host} here once requests are accepted")
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "index":
        try:
            meta = build_index(args.corpus, args.folder, args.kind, name=args.name, faiss_kind=args.faiss,
                               model_path=args.model)
        except (ValueError, FileNotFoundError) as error:  # a bad corpus: its file and line, no traceback
            print(f"error: {error}", file=sys.stderr)
            return 2
        print(json.dumps(meta, indent=1))
        return 0
    limits = Limits(**{f.name: getattr(args, f.name) for f in fields(Limits)})
    watcher = on_ready = None
    if args.lease_dir is not None:
        from cbpo.retriever.lease import idle_watcher

        if args.ready_file is None:
            parser().error("--lease-dir needs --ready-file: the state the leases share")
        watcher = idle_watcher(args.lease_dir, args.ready_file, args.idle_exit)
    if args.ready_file is not None:
        from cbpo.retriever.lease import write_ready

        on_ready = lambda url: write_ready(args.ready_file, url)  # noqa: E731
    serve(args.folder, args.host, args.port, limits, on_ready=on_ready, watcher=watcher)
    return 0


if __name__ == "__main__":
    sys.exit(main())
