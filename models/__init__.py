"""Everything that touches weights or tokenizers: loading, describing, scoring, generation, and the
embedded lab.

The ground floor these modules stood beside (errors, files, JSONL, numbers) is `capacity_advisor.core`
now. `MOVED` keeps the old module names importable for code written against them: the one place
such a name is kept (docs/architecture.md, "Moved modules")."""

import sys

from capacity_advisor.core import errors, files, jsonl, numbers

MOVED = {f"{__name__}.{m.__name__.rpartition('.')[2]}": m for m in (errors, files, jsonl, numbers)}
for _name, _module in MOVED.items():
    sys.modules.setdefault(_name, _module)
