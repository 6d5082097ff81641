"""Copy the project's single sources of truth into the Helm chart (charts/gpu-webhook).

- webhook/schema/gpu-policy.schema.json becomes `$defs.gpuPolicy` of values.schema.json, against which helm checks
  every `.rules.<file>` value (helm's validator cannot load a schema from outside the chart).
- every rule file in rules/ becomes `rules.<file name>` in values.yaml: the file's text, comments included, indented
  between the BEGIN/END marker lines of that file.

    python charts/sync_chart.py           rewrite the chart's files
    python charts/sync_chart.py --check   exit 1, naming the stale files, when they are not up to date (tests run this)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "gpu-webhook"
RULE_SCHEMA = REPO / "webhook" / "schema" / "gpu-policy.schema.json"
RULES_DIR = REPO / "rules"
INDENT = "    "


def rule_files() -> list[Path]:
    """The shipped rule files, as the server reads them (*.yaml and *.yml)."""
    return sorted(p for p in RULES_DIR.iterdir() if p.suffix in (".yaml", ".yml"))


def values_schema_text() -> str:
    """values.schema.json with the rule schema embedded under $defs.gpuPolicy."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    rule_schema = json.loads(RULE_SCHEMA.read_text())
    schema["$defs"]["gpuPolicy"] = rule_schema
    schema["properties"]["rules"]["additionalProperties"] = {"$ref": rule_schema["$id"]}
    return json.dumps(schema, indent=2) + "\n"


def _block(name: str, text: str) -> str:
    if re.search(r"^(---|\.\.\.)\s*$", text, re.M):
        raise SystemExit(f"rules/{name}: several YAML documents; values hold one document per file")
    body = "".join(f"{INDENT}{line}".rstrip() + "\n" for line in text.splitlines())
    return f'  "{name}":\n{body}'


def values_text() -> str:
    """values.yaml with each rule file's text between its BEGIN/END markers (a marker pair is added if missing)."""
    text = (CHART / "values.yaml").read_text()
    for path in rule_files():
        begin = f"  # BEGIN rules/{path.name} (copied by charts/sync_chart.py; edit rules/{path.name}, then run it)\n"
        end = f"  # END rules/{path.name}\n"
        block = begin + _block(path.name, path.read_text()) + end
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
        text, found = pattern.subn(block.replace("\\", r"\\"), text)
        if not found:
            text = text.rstrip("\n") + "\n" + block
    return text


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or with --check, compare) values.schema.json and values.yaml."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report whether the chart is up to date")
    args = parser.parse_args(argv)
    stale = []
    for path, wanted in ((CHART / "values.schema.json", values_schema_text()), (CHART / "values.yaml", values_text())):
        if path.read_text() != wanted:
            stale.append(path.relative_to(REPO))
            if not args.check:
                path.write_text(wanted)
    if args.check and stale:
        names = ", ".join(str(p) for p in stale)
        print(f"{names}: out of date with webhook/schema and rules/; run python charts/sync_chart.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
