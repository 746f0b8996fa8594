"""The training room: the one trainer (`sft`), its evaluation (`evaluate`, `callbacks`), the
manifest it reads (`manifest`), the RunRecord it writes (`record`), re-ranking (`rerank`), launch
commands (`launch`) and exports for other launchers (`export`). It imports only `models`; the
layout is in docs/architecture.md."""
