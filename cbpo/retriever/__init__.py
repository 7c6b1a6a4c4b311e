"""The suite's own retrieval server: search with no paid API (docs/retriever.md).

``corpus`` reads passages and names a corpus by content; ``index`` builds and opens bm25s or
MiniLM + FAISS indexes; ``server`` serves one over Search-R1's ``/retrieve`` API; ``lease``
shares one server per index and machine among the jobs that search it. ``python -m
cbpo.retriever index|serve`` is the command line. It imports nothing else of the suite: the
search tool (``cbpo.tools.search``) is its client.
"""
