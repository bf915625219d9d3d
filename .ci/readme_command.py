"""Print the README's command marked ``<!-- ci:NAME -->`` (the fenced block right after the marker), so that CI runs
the README's set-up commands exactly as a newcomer copies them: ``python .ci/readme_command.py main``."""

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_command(name: str) -> str:
    """The command in the fenced block after ``<!-- ci:NAME -->``; SystemExit with the reason when there is none."""
    found = re.search(rf"<!-- ci:{re.escape(name)} -->\s*```(?:bash|sh)?\n(.*?)```", README.read_text(), re.S)
    if not found:
        sys.exit(f"README.md has no fenced command after <!-- ci:{name} -->")
    return found.group(1).strip()


if __name__ == "__main__":
    print(readme_command(sys.argv[1]))
