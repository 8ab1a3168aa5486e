"""Text generation: arguments (params), token choice (sampling), text and stop sequences
(textstream), chat templates (chat), KV cache reshaping (kv) and the continuous-batching decode
loop (loop) that serves a causal LM's `infer` requests."""
