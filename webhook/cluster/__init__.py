"""The cluster as the webhook reads it: the Kubernetes API client and what is built on it.

Owns the only importer of `kubernetes` (`kube`: list+watch caches of nodes, runtime classes, namespaces and
claim templates, filling `webhook.policy.inventory` snapshots), `audit` (what already runs, judged by the current
or proposed rules) and `doctor` (one GPU Pod's path, explained).

May import: `webhook.policy` and kubernetes. Never `webhook.admission` or `webhook.cli`, nor flask, werkzeug,
gunicorn or prometheus_client.
"""
