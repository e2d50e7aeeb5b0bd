"""Post-training analysis tools: routing diagnostics, expert similarity, profiling."""
