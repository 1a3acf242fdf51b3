"""Analysis of stored runs: aggregation over repeats (later: steady state, bottleneck, cost, compare)."""
