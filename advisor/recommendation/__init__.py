"""The recommendation: the flow of `advisor recommend` (`recommend`), the typed answer and the files
written from it (`result`), advice over several draws (`draws`), an advised option parsed once
(`schedule`) and report.png (`figure`)."""
