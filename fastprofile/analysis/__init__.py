"What the numbers mean: the diagnosis, the report's sections, plots, traces, the ranks of a distributed run."
