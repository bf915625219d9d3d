"""Print the README's command marked ``<!-- ci:NAME -->`` (the fenced block right after the marker), so that CI runs
the README's set-up commands exactly as a newcomer copies them: ``python .ci/readme_command.py main``."""

import re
import sys
from pathlib import Path

name = sys.argv[1]
readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
found = re.search(rf"<!-- ci:{re.escape(name)} -->\s*```(?:bash|sh)?\n(.*?)```", readme, re.S)
if not found:
    sys.exit(f"README.md has no fenced command after <!-- ci:{name} -->")
print(found.group(1).strip())
