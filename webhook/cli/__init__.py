"""The commands: `gpu-webhook check | lint | test | rules` (`main`), `serve | certs` (`server`), `audit | doctor`
(`cluster`), and rule test cases kept as data (`rule_tests`).

May import everything; nothing imports it (`python -m webhook` and the `gpu-webhook` entry point start here).
A new verb is a `_add_<verb>` parser and a `run_<verb>` function in the module of its kind.
"""
