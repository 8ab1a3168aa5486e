// The MCP App views' URIs: the server lists and serves them, tools name the one that draws their
// results. In lib/, the dependency-free leaf every room may import.

/** The benchmark report view (run_benchmark's and get_job's results). */
export const BENCHMARK_VIEW_URI = "ui://tpu-mcp/benchmark-view.html";
/** The approval status card an approval_required result links. */
export const APPROVAL_CARD_URI = "ui://tpu-mcp/approval-card.html";
