"""The command line: it parses, calls one library function per verb and prints (click and rich).
`main.main` is the `advisor` console script; the verbs with modules of their own are `train`,
`proxies` (`advisor calibrate`), `lab` and `sweep` (the lab sweep's verbs)."""
