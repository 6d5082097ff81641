"""The pure decision core: plain values in, plain values out.

Owns Kubernetes quantities (`quantity`), where pod specs live in Pods and workloads (`pods`), the rule-file
model (`rules`), the engine and its vocabulary (`engine`, `findings`), what a Pod's own node selection says
about the class axes (`selection`), the live-cluster decisions over a snapshot (`inventory`), JSON Patch
(`patch`), manifest text (`manifests_io`) and the offline decision path shared by `check`, `test` and `audit`
(`checking`).

May import: the standard library, pyyaml, jsonschema, jsonpatch, and itself. Never flask, werkzeug, gunicorn,
kubernetes, prometheus_client, or the other webhook packages (enforced by `lint-imports`, pyproject.toml). No
files, environment, network or clock that it did not receive as an argument.

A new check belongs in `engine` (with its rule id in `rules.RULES`), and its cases in tests/rule-cases/.
"""
