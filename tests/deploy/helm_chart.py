"""deploy/helm/kvferry rendered and linted by Helm's own engine.

PyPI's helm-python-sdk binds libhelm_c (Helm v4's Go SDK behind a C ABI), so the
chart is rendered offline exactly as `helm template` renders it, with no helm
binary and no cluster. tests/run.sh installs it; a test importing this module
without it exits 77 (skipped, never passed).
"""
import os
import sys

import yaml

try:
    import helm_python as helm
    from helm_python.errors import HelmError
except ImportError:
    print("skipped: helm-python-sdk (Helm's engine) is not installed")
    sys.exit(77)

# A chart that refuses its values fails rendering (a template's `fail` or `required`).
TemplateError = HelmError


def render_chart(chart_dir, overrides=None, release="kvferry", namespace="default"):
    """[(template file name, YAML document)] of every manifest the chart renders with
    @overrides over its values.yaml, in file-name order (NOTES.txt is rendered, not parsed)."""
    manifests = helm.Chart.load(chart_dir).render(values=overrides or {}, name=release,
                                                  namespace=namespace)
    out = []
    for path in sorted(manifests):
        fn = os.path.basename(path)
        if fn == "NOTES.txt":
            continue
        out += [(fn, d) for d in yaml.safe_load_all(manifests[path]) if d]
    return out


def merged_values(chart_dir, overrides=None):
    """The chart's values.yaml with @overrides coalesced over it, as Helm does."""
    return helm.Chart.load(chart_dir).merge_values(overrides or {})


def lint_chart(chart_dir, overrides=None):
    """`helm lint --strict` with @overrides: the error and warning messages (empty when clean)."""
    report = helm.lint(chart_dir, overrides or {}, strict=True)
    return [m for m in report["messages"] if m["severity"] >= 2] + \
        [{"severity": 3, "path": "", "error": e} for e in report["errors"]]
