"""The CEL of native mode: one MutatingAdmissionPolicy and two ValidatingAdmissionPolicies, with their bindings.

These objects do not depend on the rule files: everything the rules say reaches them as params (the
`GPUClassMap` named `gpu-webhook`, see `webhook.policy.native`). So a rule edit never rewrites a policy.

CEL notes, checked on kube-apiserver 1.36 (tests/e2e/test_15_native.py):
- the Pod schema the type checker uses has no `resources.limits`/`requests` (quantities), so expressions that
  read them get a type-check *warning* in the policy's status; at runtime they are plain maps of strings;
- `quantity(s).asInteger()` fails on "500m": every count is guarded by `isInteger()`;
- a JSONPatch `add` below a missing map fails, so a missing nodeSelector, tolerations or annotations map is
  added empty first, then filled key by key (`jsonpatch.escapeKey` for keys with `/`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from webhook.policy import cel_bind, pods

Json = dict[str, Any]

GROUP = "gpu-webhook.io"
PARAMS_API = f"{GROUP}/v1alpha1"
PARAMS_KIND = "GPUClassMap"
PARAMS_NAME = "gpu-webhook"
MUTATING_NAME = "gpu-webhook.io-class"
VALIDATING_NAMES = {"deny": "gpu-webhook.io-deny", "warn": "gpu-webhook.io-warn"}
ACTIONS = {"deny": ["Deny"], "warn": ["Warn", "Audit"]}
P = "params.spec"

# The rules the validating policies check, by what can concern them: the three that look at Pods without a GPU
# request, and the others (a GPU resource). `levels` in the params lists the enforcement levels of each group, so a
# policy whose level no rule of the group has is ended by its matchCondition.
UNACCOUNTED_RULES = ("gpu-env-without-request", "gpu-runtime-without-request", "gpu-toleration-without-request")
GPU_RULES = ("gpu-whole-number", "gpu-limits-required", "gpu-requests-equal-limits", "gpu-per-container-max",
             "gpu-pod-level-resources", "gpu-class-unknown", "gpu-class-not-allowed", "gpu-class-conflict",
             "gpu-class-skipped", "gpu-class-max", "gpu-node-name-preset")
# Finer groups of the GPU rules, for a GPU object: those that concern it only through its class-table key (and its
# labels), the one that concerns a Pod with spec.nodeName, and the others (`levels.gpuAlways`).
SELECTION_RULES = ("gpu-class-unknown", "gpu-class-not-allowed", "gpu-class-skipped")
NODE_NAME_RULES = ("gpu-node-name-preset",)
CORE_RESOURCES = ("cpu", "memory", "ephemeral-storage")

_WORKLOAD_RESOURCES = (
    ("apps", "deployments"), ("apps", "replicasets"), ("apps", "statefulsets"), ("apps", "daemonsets"),
    ("batch", "jobs"), ("batch", "cronjobs"), ("", "replicationcontrollers"), ("", "podtemplates"),
)


def _cel_path(path: tuple[str | int, ...]) -> str:
    return ".".join(["object", *map(str, path)])


def _by_kind(pick: str) -> str:
    """A CEL conditional over the kinds the webhook covers; `pick` is 'spec', 'meta' or 'where'."""
    branches = []
    for kind, (spec_path, meta_path) in pods.KNOWN_KINDS.items():
        if pick == "spec":
            value = _cel_path(spec_path)
        elif pick == "labels":
            guard = f"has({_cel_path((*meta_path, 'labels'))})"
            if kind != "Pod":
                guard = f"has({_cel_path(meta_path)}) && {guard}"
            value = f"({guard} ? {_cel_path((*meta_path, 'labels'))} : {{}})"
        elif pick == "specPath":
            value = f"'{pods.render_path(spec_path)}'"
        else:
            value = f"'{pods.render_path(meta_path)}'"
        branches.append((kind, value))
    *rest, last = branches
    return " : ".join([f"object.kind == '{k}' ? {v}" for k, v in rest] + [last[1]])


# The variables both kinds of policy use. `spec` is the pod spec (the Pod's or its template's).
_COMMON_VARIABLES: list[tuple[str, str]] = [
    ("spec", _by_kind("spec")),
    ("specPath", _by_kind("specPath")),
    ("metaPath", _by_kind("metaPath")),
    ("labels", _by_kind("labels")),
    ("sel", "has(variables.spec.nodeSelector) ? variables.spec.nodeSelector : {}"),
    ("initial", "has(variables.spec.initContainers) ? variables.spec.initContainers : []"),
]


def _count(expr: str) -> str:
    """A quantity string (or int) as a whole count, 0 when not a whole non-negative number."""
    return (f"(isQuantity(string({expr})) && quantity(string({expr})).isInteger() && "
            f"quantity(string({expr})).asInteger() >= 0 ? quantity(string({expr})).asInteger() : 0)")


def _nonzero(expr: str) -> str:
    return f"!(isQuantity(string({expr})) && quantity(string({expr})).isInteger() && " \
           f"quantity(string({expr})).asInteger() == 0)"


def _gpu(name: str, kind: str | None = None) -> str:
    """Whether resource `name` is a GPU (of a `kind`: placed, validFor, checked): a map lookup for exact names,
    and a regex only for the rules' globs (patterns from params are compiled on every call)."""
    # `notGPU`: the core resource names no glob claims, so a CPU request costs no regex (compiled on every call).
    if kind is None:
        return (f"({name} in {P}.gpuExact || (!({name} in {P}.notGPU) && "
                f"{P}.gpuGlobs.exists(g, {name}.matches(g.regex))))")
    kinds = "['placed', 'validFor']" if kind == "placed" else f"['{kind}']"  # validFor families are placed too
    return (f"({name} in {P}.gpuExact ? {P}.gpuExact[{name}] in {kinds} : !({name} in {P}.notGPU) && "
            f"{P}.gpuGlobs.exists(g, g.kind in {kinds} && {name}.matches(g.regex)))")


def _limit_count(c: str, placed: bool) -> str:
    """The GPUs a container asks for in limits."""
    gpu = _gpu("r", "placed" if placed else None)
    return (f"(has({c}.resources) && has({c}.resources.limits) ? {c}.resources.limits.filter(r, {gpu})"
            f".map(r, {_count(f'{c}.resources.limits[r]')}).sum() : 0)")


# Resource r is of validFor family e: its regex, less the exact names listed before a glob (they take precedence).
# `notFamily`: the exact and core names that no family holds (precomputed), so the usual Pod costs no regex.
_FAMILY = f"(!(r in {P}.notFamily) && r.matches(e.regex) && !(r in e.shadowed))"


def _variables_gpu() -> list[tuple[str, str]]:
    sidecar = "(has(c.restartPolicy) && c.restartPolicy == 'Always')"
    return [
        ("regular", f"variables.spec.containers.map(c, {_limit_count('c', True)}).sum() + "
                    f"variables.initial.filter(c, {sidecar}).map(c, {_limit_count('c', True)}).sum()"),
        # Each regular init container with the sidecars declared before it (they are already running).
        ("initPeak", f"variables.initial.filter(c, !{sidecar}).map(c, {_limit_count('c', True)} + "
                     f"variables.initial.filter(s, {sidecar.replace('c.', 's.')} && variables.initial.indexOf(s) < "
                     f"variables.initial.indexOf(c)).map(s, {_limit_count('s', True)}).sum())"),
        ("gpus", "variables.initPeak.exists(n, n > variables.regular) ? variables.initPeak.max() : variables.regular"),
        # A GPU spec, as the engine counts one: some GPU quantity that is not exactly 0 (a wrong one counts too).
        ("anyGPU", "(variables.spec.containers + variables.initial).exists(c, has(c.resources) && "
                   f"((has(c.resources.limits) && c.resources.limits.exists(r, {_gpu('r')} && "
                   f"{_nonzero('c.resources.limits[r]')})) || (has(c.resources.requests) && "
                   f"c.resources.requests.exists(r, {_gpu('r')} && {_nonzero('c.resources.requests[r]')}))))"),
        ("deferred", "has(variables.spec.affinity) && has(variables.spec.affinity.nodeAffinity) && "
                     "has(variables.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution)"),
        # The validFor families the Pod asks for (in limits or requests), and the first container asking.
        ("vf", "(variables.spec.containers + variables.initial).all(c, !has(c.resources) || ((!has(c.resources.limits) "
               f"|| c.resources.limits.all(r, r in {P}.notFamily)) && (!has(c.resources.requests) || "
               f"c.resources.requests.all(r, r in {P}.notFamily)))) ? [] : "
               f"{P}.validFor.filter(e, (variables.spec.containers + variables.initial).exists(c, "
               "has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, " + _FAMILY + ")) "
               "|| (has(c.resources.requests) && c.resources.requests.exists(r, " + _FAMILY + ")))))"),
        ("vfContainers", "size(variables.vf) == 0 ? [] : (variables.initial + variables.spec.containers).filter(c, "
                         "has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, "
                         "variables.vf.exists(e, " + _FAMILY + "))) || (has(c.resources.requests) && "
                         "c.resources.requests.exists(r, variables.vf.exists(e, " + _FAMILY + ")))))"),
        ("limitWhere", "size(variables.vfContainers) == 0 ? '' : variables.specPath + '.' + "
                       "(variables.initial.exists(i, i == variables.vfContainers[0]) ? 'initContainers[' + "
                       "string(variables.initial.indexOf(variables.vfContainers[0])) : 'containers[' + "
                       "string(variables.spec.containers.indexOf(variables.vfContainers[0]))) + '] (' + "
                       "variables.vfContainers[0].name + ')'"),
        ("limitResource", "size(variables.vfContainers) == 0 ? '' : ((has(variables.vfContainers[0].resources.limits) "
                          "? variables.vfContainers[0].resources.limits.map(r, r) : []) + "
                          "(has(variables.vfContainers[0].resources.requests) ? "
                          "variables.vfContainers[0].resources.requests.map(r, r) : [])).filter(r, "
                          "variables.vf.exists(e, " + _FAMILY + "))[0]"),
        ("nsKey", f"request.namespace in {P}.namespaces ? {P}.namespaces[request.namespace] : '*'"),
        ("key", f"variables.nsKey + {P}.axes.map(a, '#' + (a.label in variables.labels ? variables.labels[a.label] "
                ": '') + '=' + (a.keys.exists(k, k in variables.sel) ? a.values.filter(v, a.keys.all(k, "
                # An entry of a value's own nodeSelector (what the MAP injects) admits that value alone: no regex.
                "!(k in variables.sel) || (has(params.spec.ownSel) && (a.name + '|' + k + '=' + variables.sel[k]) in "
                "params.spec.ownSel ? params.spec.ownSel[a.name + '|' + k + '=' + variables.sel[k]] == v : "
                "((a.name + '|' + v + '|' + k) in params.spec.aliases && variables.sel[k].matches("
                "params.spec.aliases[a.name + '|' + v + '|' + k]))))).join(',') : '*') + '/' + "
                "(variables.vf.exists(e, a.name in e.values) ? a.values.filter(v, variables.vf.filter(e, a.name in "
                "e.values).all(e, v in e.values[a.name])).join(',') : '*'))"
                ".join('')"),
        ("tabled", f"!variables.deferred && variables.key in {P}.table"),
        ("exempt", f"request.namespace in {P}.exemptNamespaces"),
    ]


def _variable_pairs(extra: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A policy's variables as (name, expression), in definition order: the shared ones, then `extra`."""
    return _COMMON_VARIABLES + _variables_gpu() + extra


def _variables(extra: list[tuple[str, str]]) -> list[Json]:
    return [{"name": name, "expression": expr} for name, expr in _variable_pairs(extra)]


def _where(c: str, listname: str) -> str:
    """`spec.containers[0] (train)` in CEL, for container `c` of list `listname` (a CEL string expression)."""
    return (f"variables.specPath + '.' + {listname} + '[' + string(({listname} == 'containers' ? "
            f"variables.spec.containers : variables.initial).indexOf({c})) + '] (' + {c}.name + ')'")


def _per_container(check: str, message: str) -> tuple[str, str]:
    """A check over every container (init first, as the webhook reports), and the message of the ones that fail.

    `check`/`message` use `c` (the container), `l` (its list's name) and `r` (a GPU resource name)."""
    lists = "['initContainers', 'containers']"
    each = "(l == 'containers' ? variables.spec.containers : variables.initial)"
    ok = f"{lists}.all(l, {each}.all(c, {check}))"
    msg = f"{lists}.map(l, {each}.filter(c, !({check})).map(c, {message})).map(x, x.join('; ')).filter(x, x != '')" \
          ".join('; ')"
    return ok, msg


def _rule(rule: str, level: str, ok: str, message: str, pod_only: bool = False) -> Json:
    scope = "object.kind != 'Pod' || " if pod_only else ""
    gate = f"variables.exempt || {P}.enforcement['{rule}'] != '{level}' || {scope}({ok})"
    return {"expression": gate, "messageExpression": f"'[{rule}] ' + {message}"}


# How the Pod's own nodeSelector speaks about the axis of finding `f` (the engine's `selection.describe`).
_SELECTION = (f"{P}.axes.filter(a, a.name == f.axis).map(a, variables.sel.filter(k, k in a.keys).map(k, "
              "variables.specPath + '.nodeSelector[' + k + ']=' + variables.sel[k]).join(' or ')).join('')")


def _validations(level: str) -> list[Json]:
    out: list[Json] = []
    limits = "c.resources.limits"
    requests = "c.resources.requests"
    has_l = "(has(c.resources) && has(c.resources.limits))"
    has_r = "(has(c.resources) && has(c.resources.requests))"

    def gpu_names(table: str, present: str) -> str:
        return f"({present} ? {table}.filter(r, {_gpu('r')}) : [])"

    where = _where("c", "l")
    # gpu-whole-number: a GPU quantity is not whole.
    for part, table, present in (("limits", limits, has_l), ("requests", requests, has_r)):
        ok, msg = _per_container(
            f"{gpu_names(table, present)}.all(r, !isQuantity(string({table}[r])) || "
            f"quantity(string({table}[r])).isInteger())",
            f"{where} + ': resources.{part}[' + {gpu_names(table, present)}.filter(r, isQuantity(string({table}[r]))"
            f" && !quantity(string({table}[r])).isInteger())[0] + ']: Invalid value: \"' + string({table}["
            f"{gpu_names(table, present)}.filter(r, isQuantity(string({table}[r])) && "
            f"!quantity(string({table}[r])).isInteger())[0]]) + '\": must be an integer; a GPU cannot be split this "
            "way: ask for whole GPUs, or use a shared (nvidia.com/gpu.shared) or MIG (nvidia.com/mig-1g.5gb) "
            "resource'")
        out.append(_rule("gpu-whole-number", level, ok, msg))
    # gpu-limits-required: in requests but not in limits.
    missing = f"{gpu_names(requests, has_r)}.filter(r, !{has_l} || !(r in {limits}))"
    ok, msg = _per_container(f"size({missing}) == 0",
                             f"{where} + ': ' + {missing}[0] + ' is in requests but not in limits; GPUs are "
                             f"requested in limits: move ' + {missing}[0] + ': ' + string({requests}[{missing}[0]])"
                             " + ' to resources.limits'")
    out.append(_rule("gpu-limits-required", level, ok, msg))
    # gpu-requests-equal-limits.
    differ = (f"{gpu_names(requests, has_r)}.filter(r, {has_l} && r in {limits} && isQuantity(string({limits}[r])) "
              f"&& isQuantity(string({requests}[r])) && quantity(string({limits}[r])).compareTo("
              f"quantity(string({requests}[r]))) != 0)")
    ok, msg = _per_container(
        f"size({differ}) == 0",
        f"{where} + ': resources.requests: Invalid value: \"' + string({requests}[{differ}[0]]) + '\": must be equal "
        f"to ' + {differ}[0] + ' limit of ' + string({limits}[{differ}[0]]) + '; set requests equal to limits, or "
        "remove the request (it defaults to the limit)'")
    out.append(_rule("gpu-requests-equal-limits", level, ok, msg))
    # gpu-per-container-max.
    over = (f"{gpu_names(limits, has_l)}.filter(r, !(r in {P}.uncapped) && {P}.resources.exists(g, "
            "g.maxPerContainer > 0 && "
            f"r.matches(g.regex) && {_count(f'{limits}[r]')} > g.maxPerContainer))")
    first = f"{P}.resources.filter(g, g.maxPerContainer > 0 && {over}[0].matches(g.regex))[0]"
    ok, msg = _per_container(
        f"size({over}) == 0",
        f"{where} + ': asks for ' + string({_count(f'{limits}[{over}[0]]')}) + ' ' + {over}[0] + ' but a container "
        f"may have at most ' + string({first}.maxPerContainer) + ({first}.reason != '' ? ' (' + {first}.reason + ')' "
        f": '') + '; ask for ' + string({first}.maxPerContainer) + ', or use whole GPUs (nvidia.com/gpu)'")
    out.append(_rule("gpu-per-container-max", level, ok, msg))
    # gpu-pod-level-resources.
    pod_level = (f"(has(variables.spec.resources) && has(variables.spec.resources.limits) ? "
                 f"variables.spec.resources.limits.filter(r, {_gpu('r')}) : [])")
    out.append(_rule("gpu-pod-level-resources", level, f"size({pod_level}) == 0",
                     f"variables.specPath + '.resources.limits[' + {pod_level}[0] + ']: GPUs cannot be set in "
                     "pod-level resources (only cpu, memory and hugepages can); move it to each container\\'s "
                     "resources.limits'"))
    # gpu-class-unknown: a class label value the rules do not define.
    unknown = f"{P}.axes.filter(a, a.label in variables.labels && !(variables.labels[a.label] in a.values))"
    out.append(_rule("gpu-class-unknown", level, f"!variables.anyGPU || size({unknown}) == 0",
                     f"{unknown}.map(a, variables.metaPath + '.labels[' + a.label + ']: \"' + variables.labels[a.label]"
                     " + '\" is not a ' + a.name + ' class; choose one of: ' + a.values.join(', ')).join('; [gpu-class-"
                     "unknown] ')"))
    # The class table's findings (gpu-class-not-allowed, gpu-class-conflict, gpu-class-skipped).
    plan = f"{P}.plans[{P}.table[variables.key]]"
    mine = f"{plan}.findings.filter(f, {P}.enforcement[f.rule] == '{level}')"
    for rule in ("gpu-class-not-allowed", "gpu-class-conflict", "gpu-class-skipped"):
        theirs = f"{mine}.filter(f, f.rule == '{rule}')"
        out.append(_rule(rule, level, f"!variables.anyGPU || !variables.tabled || size({theirs}) == 0",
                         f"{theirs}.map(f, f.message.replace('{{meta}}', variables.metaPath).replace('{{spec}}', "
                         f"variables.specPath).replace('{{namespace}}', request.namespace)"
                         f".replace('{{selection}}', {_SELECTION}).replace('{{limitWhere}}', variables.limitWhere)"
                         f".replace('{{limitResource}}', variables.limitResource)).join('; [{rule}] ')"))
    # gpu-class-conflict: a field the class requires, set to something else.
    required = (f"(has({plan}.required) ? {plan}.required : []).filter(q, q.field in variables.spec && "
                "string(variables.spec[q.field]) != '' && string(variables.spec[q.field]) != q.value && "
                "!(q.field == 'schedulerName' && string(variables.spec[q.field]) == 'default-scheduler'))")
    out.append(_rule("gpu-class-conflict", level, f"!variables.anyGPU || !variables.tabled || size({required}) == 0",
                     f"{required}.map(q, variables.specPath + '.' + q.field + ' is \"' + "
                     f"string(variables.spec[q.field]) + '\" but class ' + {plan}.className + ' (' + q.source + ') "
                     "requires \"' + q.value + '\"; remove it from the Pod or pick the class you meant').join('; ')"))
    # gpu-class-max.
    out.append(_rule("gpu-class-max", level,
                     f"!variables.tabled || !has({plan}.maxGPUs) || variables.gpus <= {plan}.maxGPUs",
                     f"'the Pod needs ' + string(variables.gpus) + ' GPUs (containers and sidecars, or the largest init"
                     f" container) but class ' + {plan}.className + ' allows at most ' + string({plan}.maxGPUs) + "
                     f"' (set by ' + {plan}.maxGPUsSource + '); ask for fewer, or pick a class that allows more with "
                     "the class labels'"))
    # gpu-node-name-preset.
    out.append(_rule("gpu-node-name-preset", level,
                     "variables.gpus == 0 || !has(object.spec.nodeName) || object.spec.nodeName == ''",
                     "'spec.nodeName=\\'' + object.spec.nodeName + '\\' bypasses the scheduler\\'s GPU accounting; "
                     "remove it (the class nodeSelector places the Pod)'", pod_only=True))
    # GPU access the scheduler does not see.
    env = ("(has(c.env) ? c.env.filter(e, e.name == 'NVIDIA_VISIBLE_DEVICES' && has(e.value) && "
           "!(e.value.trim().lowerAscii() in ['void', 'none', ''])) : [])")
    ok, msg = _per_container(f"size({env}) == 0",
                             f"{where} + ': NVIDIA_VISIBLE_DEVICES=' + {env}[0].value + ' reaches GPUs the scheduler "
                             "does not count; request nvidia.com/gpu in limits'")
    out.append(_rule("gpu-env-without-request", level, f"variables.anyGPU || ({ok})", msg))
    out.append(_rule("gpu-runtime-without-request", level,
                     "variables.anyGPU || !has(variables.spec.runtimeClassName) || "
                     f"!(variables.spec.runtimeClassName in {P}.gpuRuntimeClasses)",
                     "variables.specPath + '.runtimeClassName=' + variables.spec.runtimeClassName + ' without a GPU "
                     "request; request nvidia.com/gpu in limits or drop it'"))
    tolerated = (f"(has(variables.spec.tolerations) ? variables.spec.tolerations.filter(t, has(t.key) && "
                 f"t.key in {P}.gpuTaintKeys && (!has(t.effect) || t.effect == '' || t.effect == 'NoSchedule')) : [])")
    out.append(_rule("gpu-toleration-without-request", level, f"variables.anyGPU || size({tolerated}) == 0",
                     f"variables.specPath + '.tolerations: tolerates ' + {tolerated}[0].key + ' with no GPU request "
                     "(it may hold a GPU node); drop it or request a GPU'"))
    return out


# The resources every Pod may ask for that are never a GPU (hugepages-<size> too): a Pod that asks for nothing
# else cannot concern a GPU rule's check.
_CORE_RESOURCES = "[" + ", ".join(f"'{r}'" for r in CORE_RESOURCES) + "]"


def _other_names(table: str) -> str:
    """Whether the resource map `table` (maybe absent) names something other than the core resources."""
    return (f"(has({table}) && {table}.exists(r, !(r in {_CORE_RESOURCES}) && "
            "!r.startsWith('hugepages-')))")


def resources_guard(s: str) -> str:
    """Pod spec `s` asks for a resource that may be a GPU (containers, init containers, pod-level), or has DRA
    claims. Reads resource names only, no params and no quantities."""
    def asks(c: str) -> str:
        return f"(has({c}.resources) && ({_other_names(f'{c}.resources.limits')} || " \
               f"{_other_names(f'{c}.resources.requests')}))"
    return (f"(has({s}.containers) && {s}.containers.exists(c, {asks('c')})) || (has({s}.initContainers) && "
            f"{s}.initContainers.exists(c, {asks('c')})) || {asks(s)} || has({s}.resourceClaims)")


def _unaccounted_guard(s: str) -> str:
    """Pod spec `s` has what the three *-without-request rules look at: a runtimeClassName, a toleration that may
    hold a GPU node (a key, and an effect that is not NoExecute: DefaultTolerationSeconds adds two of those to
    every Pod), or NVIDIA_VISIBLE_DEVICES in a container's env."""
    env = "(has(c.env) && c.env.exists(e, e.name == 'NVIDIA_VISIBLE_DEVICES'))"
    return (f"has({s}.runtimeClassName) || (has({s}.tolerations) && {s}.tolerations.exists(t, has(t.key) && "
            "(!has(t.effect) || t.effect == '' || t.effect == 'NoSchedule'))) || "
            f"(has({s}.containers) && {s}.containers.exists(c, {env})) || "
            f"(has({s}.initContainers) && {s}.initContainers.exists(c, {env}))")


def _by_spec(check: Callable[[str], str]) -> str:
    """`check` of the pod spec, whichever kind the object is (one branch per distinct spec path)."""
    spec_paths: dict[str, list[str]] = {}
    for kind, (spec_path, _) in pods.KNOWN_KINDS.items():
        spec_paths.setdefault(_cel_path(spec_path), []).append(kind)
    *rest, (last, _) = sorted(spec_paths.items(), key=lambda item: len(item[1]))
    branches = [f"({' || '.join(f'object.kind == {k!r}' for k in kinds)}) ? ({check(path)})" for path, kinds in rest]
    return " : ".join([*branches, f"({check(last)})"])


def webhook_guard() -> Json:
    """Hybrid mode's validating webhook: the objects the native policies cannot judge alone. A Pod or workload
    template that asks for a resource that may be a GPU, or has DRA claims (the live-cluster rules), and every DRA
    claim and claim template. The rest (a CPU-only Pod: at most the three *-without-request rules) is the policies'.
    Resource names only, no params (a webhook's matchConditions cannot read them)."""
    return {"name": "may-concern-gpus",
            "expression": f"request.resource.group == 'resource.k8s.io' || ({_by_spec(resources_guard)})"}


def gpu_guard() -> Json:
    """The mutating policy's matchCondition: a Pod that asks for no resource that may be a GPU is not read further
    (a false matchCondition skips the variables and the patch). Resource names only, no params."""
    return {"name": "may-concern-gpus", "expression": resources_guard("object.spec")}


def _plainly_placed(s: str) -> str:
    """Pod spec `s` (with its metadata) says about each class axis at most one value, as the MAP's injection does:
    its axis keys in the nodeSelector are entries of one value's own nodeSelector that admit that value alone
    (`ownSel`), an axis label names a value and agrees with them, and it asks for no resource of a validFor family.
    Its class-table key is then one of those `levels.plain` was computed over. No regex."""
    m = s[: -len("spec")] + "metadata"
    labels = f"has({m}.labels)" if m == "object.metadata" else f"has({m}) && has({m}.labels)"
    keys = f"(has({s}.nodeSelector) ? a.keys.filter(k, k in {s}.nodeSelector) : [])"
    said = f"{keys}.map(k, {P}.ownSel[a.name + '|' + k + '=' + {s}.nodeSelector[k]])"
    family = f"(!(r in {P}.notFamily) && {P}.validFor.exists(e, r.matches(e.regex) && !(r in e.shadowed)))"
    asks = (f"(has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, {family})) || "
            f"(has(c.resources.requests) && c.resources.requests.exists(r, {family}))))")
    return (f"has({P}.ownSel) && {P}.axes.all(a, {keys}.all(k, (a.name + '|' + k + '=' + {s}.nodeSelector[k]) in "
            f"{P}.ownSel) && {said}.all(w, w == {said}[0]) && (!({labels} && a.label in {m}.labels) || "
            f"({m}.labels[a.label] in a.values && {said}.all(w, w == {m}.labels[a.label])))) && "
            f"!((has({s}.containers) && {s}.containers.exists(c, {asks})) || "
            f"(has({s}.initContainers) && {s}.initContainers.exists(c, {asks})))")


def level_guard(level: str) -> Json:
    """A validating policy's matchCondition: some rule at `level` may concern the object. The GPU rules when it asks
    for a resource that may be a GPU, the three *-without-request rules when it has what they look at and asks for
    no GPU; each only when the params put a rule of its group at this level (`levels`). For a GPU object, finer:
    when the level has only selection rules and gpu-node-name-preset, a Pod with spec.nodeName, or one that says more
    about the class axes than one value each (`_plainly_placed`), unless some such key has a finding at the level
    (`levels.plain`). A CPU-only Pod, or a GPU Pod no rule at the level can concern, ends here: no variables,
    validations or messages are evaluated. Params without the finer groups (a CRD older than them prunes them) fall
    back to the GPU group."""
    def check(s: str) -> str:
        node_name = f"has({s}.nodeName) && {s}.nodeName != ''" if s == "object.spec" else "false"
        finer = (f"!has({P}.levels.gpuAlways) || '{level}' in {P}.levels.gpuAlways || "
                 f"('{level}' in {P}.levels.nodeName && {node_name}) || ('{level}' in {P}.levels.selection && "
                 f"('{level}' in {P}.levels.plain || !({_plainly_placed(s)})))")
        # The *-without-request rules concern only an object without a GPU; the class the MAP injects into a GPU Pod
        # (a runtimeClassName, the GPU tolerations) would pass their guard. A container asking for an exact GPU name
        # a quantity that is not 0 makes it a GPU object (`anyGPU`).
        gpu = (f"(has({s}.containers) && {s}.containers.exists(c, has(c.resources) && has(c.resources.limits) && "
               f"c.resources.limits.exists(r, r in {P}.gpuExact && {_nonzero('c.resources.limits[r]')})))")
        return (f"('{level}' in {P}.levels.gpu && ({resources_guard(s)}) && ({finer})) || "
                f"('{level}' in {P}.levels.unaccounted && ({_unaccounted_guard(s)}) && !{gpu})")
    return {"name": f"rules-at-{level}-may-concern-it", "expression": _by_spec(check)}


def _match(resources: list[tuple[str, str]], operations: list[str]) -> Json:
    return {"resourceRules": [{"apiGroups": [g], "apiVersions": ["v1"], "operations": operations,
                               "resources": [r]} for g, r in resources]}


_COVERS = ("(!has(h.effect) || h.effect == '' || (has(w.effect) && h.effect == w.effect)) && "
           "(!has(h.tolerationSeconds) || (has(w.tolerationSeconds) && h.tolerationSeconds == w.tolerationSeconds)) && "
           "((has(h.operator) && h.operator == 'Exists') ? (!has(h.key) || h.key == '' || (has(w.key) && "
           "h.key == w.key)) : ((!has(w.operator) || w.operator == 'Equal') && (has(h.key) ? h.key : '') == "
           "(has(w.key) ? w.key : '') && (has(h.value) ? h.value : '') == (has(w.value) ? w.value : '')))")


def _mutating() -> Json:
    plan = "variables.plan"
    extra = [
        ("apply", f"!variables.exempt && variables.gpus > 0 && variables.tabled && !{P}.plans[{P}.table["
                  "variables.key]].findings.exists(f, {P}.enforcement[f.rule] == 'deny')"
                  .replace("{P}", P)),
        ("plan", f"variables.tabled ? {P}.plans[{P}.table[variables.key]] : {P}.plans[{P}.table.map(k, k)[0]]"),
        ("addSel", f"variables.apply && has({plan}.nodeSelector) ? {plan}.nodeSelector.filter(k, "
                   "!(k in variables.sel)) : []"),
        ("addTol", f"variables.apply && has({plan}.tolerations) ? {plan}.tolerations.filter(w, "
                   f"!(has(object.spec.tolerations) && object.spec.tolerations.exists(h, {_COVERS}))) : []"),
        ("fields", f"variables.apply ? ['runtimeClassName', 'priorityClassName', 'schedulerName'].filter(f, "
                   f"f in {plan} && (!(f in object.spec) || string(object.spec[f]) == '' || (f == 'schedulerName' && "
                   f"object.spec[f] == 'default-scheduler' && {plan}[f] != 'default-scheduler'))) : []"),
        ("addLabels", f"variables.apply && has({plan}.labels) ? {plan}.labels.filter(k, !has(object.metadata.labels) "
                      "|| !(k in object.metadata.labels)) : []"),
        ("changes", "size(variables.addSel) + size(variables.addTol) + size(variables.fields) + "
                    "size(variables.addLabels)"),
        ("annotations", f"variables.changes == 0 ? {{}} : (has({plan}.annotations) ? {plan}.annotations : {{}})"),
        ("addAnnotations", "variables.changes == 0 ? [] : ['gpu-webhook.io/class', 'gpu-webhook.io/rules'] + "
                           "variables.annotations.map(k, k)"),
    ]
    patch = (
        "(size(variables.addSel) > 0 && !has(object.spec.nodeSelector) ? [JSONPatch{op: 'add', path: "
        "'/spec/nodeSelector', value: {}}] : []) + "
        "variables.addSel.map(k, JSONPatch{op: 'add', path: '/spec/nodeSelector/' + jsonpatch.escapeKey(k), "
        f"value: {plan}.nodeSelector[k]}}) + "
        "(size(variables.addTol) > 0 && !has(object.spec.tolerations) ? [JSONPatch{op: 'add', path: "
        "'/spec/tolerations', value: []}] : []) + "
        "variables.addTol.map(w, JSONPatch{op: 'add', path: '/spec/tolerations/-', value: w}) + "
        f"variables.fields.map(f, JSONPatch{{op: 'add', path: '/spec/' + f, value: {plan}[f]}}) + "
        "(variables.fields.exists(f, f == 'priorityClassName') && has(object.spec.priority) ? [JSONPatch{op: "
        "'remove', path: '/spec/priority'}] : []) + "
        "(size(variables.addLabels) > 0 && !has(object.metadata.labels) ? [JSONPatch{op: 'add', path: "
        "'/metadata/labels', value: {}}] : []) + "
        "variables.addLabels.map(k, JSONPatch{op: 'add', path: '/metadata/labels/' + jsonpatch.escapeKey(k), "
        f"value: {plan}.labels[k]}}) + "
        "(variables.changes > 0 && !has(object.metadata.annotations) ? [JSONPatch{op: 'add', path: "
        "'/metadata/annotations', value: {}}] : []) + "
        "variables.addAnnotations.filter(k, !has(object.metadata.annotations) || !(k in object.metadata.annotations))"
        ".map(k, JSONPatch{op: 'add', path: '/metadata/annotations/' + jsonpatch.escapeKey(k), value: "
        f"k == 'gpu-webhook.io/class' ? {plan}.className : k == 'gpu-webhook.io/rules' ? {P}.rulesDigest : "
        "variables.annotations[k]})"
    )
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": MUTATING_NAME, "labels": {"app.kubernetes.io/name": "gpu-webhook"}},
        "spec": {
            "paramKind": {"apiVersion": PARAMS_API, "kind": PARAMS_KIND},
            "matchConstraints": _match([("", "pods")], ["CREATE"]),
            "matchConditions": [NOT_A_MIRROR_POD, gpu_guard()],
            "failurePolicy": "Fail",
            "reinvocationPolicy": "IfNeeded",
            "variables": _variables(extra),
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": patch}}],
        },
    }


def failing_guard(level: str, checks: list[Json]) -> Json:
    """A validating policy's last matchCondition: some rule at `level` may concern the object (`level_guard`) and
    one of its checks fails. A Pod that passes every check ends here, after one evaluation of the checks: the API
    server evaluates the validations and then every messageExpression in passes of their own, each evaluating the
    variables again, so a passing Pod would otherwise pay for the checks twice and for the policy's activations
    twice more. The checks read the policy's variables, which a matchCondition cannot: `cel_bind.bind` evaluates
    the ones they need in the condition itself. A Pod for which it is true is judged by the validations as before."""
    failing = " || ".join(f"!({check['expression']})" for check in checks)
    return {"name": f"some-rule-at-{level}-fails", "expression": f"({level_guard(level)['expression']}) && "
                                                                 f"({cel_bind.bind(failing, _variable_pairs([]))})"}


def _validating(level: str) -> Json:
    # Each check is a variable that its validation and its messageExpression both read: the API server evaluates
    # every messageExpression, pass or fail, so a message costs only that variable unless its check failed.
    failed: list[tuple[str, str]] = []
    validations: list[Json] = []
    checks = _validations(level)
    for index, check in enumerate(checks):
        name = f"failed{index}"
        failed.append((name, f"!({check['expression']})"))
        validations.append({"expression": f"!variables.{name}",
                            "messageExpression": f"variables.{name} ? {check['messageExpression']} : ''"})
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": VALIDATING_NAMES[level], "labels": {"app.kubernetes.io/name": "gpu-webhook"}},
        "spec": {
            "paramKind": {"apiVersion": PARAMS_API, "kind": PARAMS_KIND},
            "matchConstraints": _match([("", "pods"), *_WORKLOAD_RESOURCES], ["CREATE", "UPDATE"]),
            # Pod UPDATEs cannot change placement or resources, and a workload UPDATE that keeps its template
            # is not judged (as the webhook).
            "matchConditions": [
                NOT_A_MIRROR_POD,
                {"name": "not-a-pod-update", "expression": "request.operation == 'CREATE' || object.kind != 'Pod'"},
                {"name": "template-changed", "expression": (
                    "request.operation == 'CREATE' || object.kind == 'Pod' || oldObject == null || "
                    "(object.kind == 'PodTemplate' ? object.template != oldObject.template : object.kind == 'CronJob' "
                    "? object.spec.jobTemplate.spec.template != oldObject.spec.jobTemplate.spec.template : "
                    "object.spec.template != oldObject.spec.template)")},
                failing_guard(level, checks),
            ],
            "failurePolicy": "Fail",
            "variables": _variables(failed),
            "validations": validations,
        },
    }


# The same scope as the webhook configurations in manifests/base: never the system namespaces nor the webhook's
# own, and a namespace label to opt out; mirror Pods (the kubelet's copies of static Pods) are never touched.
NAMESPACE_SELECTOR: Json = {"matchExpressions": [
    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kube-node-lease",
                                                                           "gpu-system"]},
    {"key": "gpu-webhook.io/ignore", "operator": "DoesNotExist"}]}
NOT_A_MIRROR_POD: Json = {"name": "not-a-mirror-pod", "expression": "!has(object.metadata.annotations) || "
                          "!('kubernetes.io/config.mirror' in object.metadata.annotations)"}


def _binding(kind: str, name: str, actions: list[str] | None) -> Json:
    spec: Json = {"policyName": name, "paramRef": {"name": PARAMS_NAME, "parameterNotFoundAction": "Deny"},
                  "matchResources": {"namespaceSelector": NAMESPACE_SELECTOR}}
    if actions is not None:
        spec["validationActions"] = actions
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": f"{kind}Binding",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "gpu-webhook"}}, "spec": spec}


def policies() -> list[Json]:
    """The policies and their bindings, in apply order."""
    out = [_mutating(), _binding("MutatingAdmissionPolicy", MUTATING_NAME, None)]
    for level in ("deny", "warn"):
        out += [_validating(level), _binding("ValidatingAdmissionPolicy", VALIDATING_NAMES[level], ACTIONS[level])]
    return out
