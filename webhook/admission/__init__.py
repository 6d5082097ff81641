"""The admission server: AdmissionReview on the wire, and everything around one review.

Owns the AdmissionReview format (`review`), the Flask app and its routes (`app`), gunicorn's configuration and
workers (`gunicorn_conf`), TLS material and its rotation (`tls`, `certs`), Prometheus metrics (`metrics`), JSON
logs (`logs`), reading rule files and keeping the last good ones (`loader`, `policy_store`), and the server's
settings (`settings`, the one place the environment is read).

May import: `webhook.policy`, `webhook.cluster` (the inventory watcher, with cluster awareness), flask,
werkzeug, gunicorn, prometheus_client, cryptography. Never `webhook.cli`.

A new endpoint belongs in `app`, with its parsing in `review`.
"""
