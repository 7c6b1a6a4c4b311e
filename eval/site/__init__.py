"""A study's results browser: static pages under one folder, opened from disk with no server.

    python -m eval.site --tables results/tables/S/table1.csv --figures results/figures/S/fig2.png ... \
        --runs runs/S/seed0/grpo runs/S/seed0/cbpo --label "..." --out results/site

``index.html`` shows each table (sortable, reproduced beside the paper) and figure;
``trajectories.html`` the rollout dumps of the given run folders (``build``, ``trajectories``).
"""
