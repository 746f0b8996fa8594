"""The training room: the one trainer (`sft`, with its Trainer settings in `trainer_settings` and
its command line in `sft_cli`), its evaluation (`evaluate`, `callbacks`), the manifest it reads
(`manifest`), the RunRecord it writes (`record`), re-ranking (`rerank`), launch commands
(`launch`) and exports for other launchers (`export`). It imports only `models`; the layout is in
docs/architecture.md."""
