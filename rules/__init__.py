"""The shipped rule files, packaged as ``webhook.default_rules`` so an installed gpu-webhook runs with no arguments."""
