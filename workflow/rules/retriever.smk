# Search through the suite's own retrieval server (cbpo.retriever, docs/retriever.md). With
# search_backend=http and no search_url, every rl and evaluate job gets the index folder
# (++tools_cfg.search_options.index) and leases a server on it: the first job on a machine
# starts it, the last one's end stops it (cbpo/retriever/lease.py says why not Snakemake's
# service() outputs). The index is built once per corpus and kind.
from cbpo.retriever.index import STUDY_INDEX, study_index

SEARCH_BACKEND = config["search_backend"]
RETRIEVER_INDEX = study_index(config)
# Where each corpus comes from: built here, or fetched into the data root (rule fetch).
RETRIEVER_CORPORA = {"small": "data/retriever/small.jsonl", "wiki18": str(corpus_item("wiki18", Path(DATA_ROOT)).target)}


def search_args():
    """The Hydra overrides that point a job's search tool where the study searches."""
    if SEARCH_BACKEND is None:
        return []
    args = [f"tools_cfg.search_backend={SEARCH_BACKEND}"]
    if SEARCH_BACKEND == "http":
        # absolute: verl's Ray workers build the search tool too, from their own working folder
        where = f"url={config['search_url']}" if config["search_url"] else f"index={os.path.abspath(RETRIEVER_INDEX)}"
        args.append(f"++tools_cfg.search_options.{where}")
    return args


SEARCH = search_args()
SEARCH_INPUT = [f"{RETRIEVER_INDEX}/meta.json"] if RETRIEVER_INDEX else []

rule retriever_corpus:
    input: rules.data.output
    output: RETRIEVER_CORPORA["small"]
    log: "logs/retriever_corpus.log"
    threads: 1
    params: data_root=DATA_ROOT
    shell: command("cbpo.prepare target=corpus data_root={params.data_root:q}")

rule retriever:
    input: lambda w: RETRIEVER_CORPORA[w.corpus]
    output: f"{STUDY_INDEX}/meta.json"
    log: "logs/retriever_{corpus}-{kind}.log"
    benchmark: "results/benchmarks/retriever_{corpus}-{kind}.tsv"
    wildcard_constraints: corpus="small|wiki18", kind="bm25|dense"
    threads: 1
    resources: **resources("retriever")
    params: folder=lambda w, output: os.path.dirname(output[0])
    shell: command("cbpo.retriever index {input:q} {params.folder:q} --kind {wildcards.kind:q} --name {wildcards.corpus:q}")
