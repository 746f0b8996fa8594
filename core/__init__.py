"""The ground floor: what every room needs and that knows nothing of weights, training or advice —
the one user error (`errors`), files written atomically, fingerprints, locks and the cache home
(`files`), a user's JSONL read strictly (`jsonl`), the value tests every reader applies and the
strict JSON parse (`numbers`), and resumable work in cached shards (`shards`). It imports nothing
of ours outside it."""
