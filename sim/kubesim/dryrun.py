"""`dryRun`: which writes only pretend, and the refusal of a value the server does not know.

kube-apiserver decodes `?dryRun=` into the verb's options (CreateOptions,
UpdateOptions, PatchOptions, DeleteOptions; a DELETE may carry it in its body
too) and validates it before anything else: `All` is the only value
(apimachinery's `ValidateDryRun`), anything else is a 422 `Invalid` of the
options object (`errors.NewInvalid(meta.k8s.io/<Kind>Options, "", errs)` in the
handlers). A dry run then runs every check of the real write (admission,
validation, preconditions, an existing name on create) and answers with the
object as it would be stored, writing nothing (registry's DryRunnableStorage).
"""

from __future__ import annotations

from typing import Any

from kubesim.errors import GoRaw, field_not_supported, invalid_object

__all__ = ["dry_run_requested"]

_OPTIONS_KIND = {
    "create": "CreateOptions",
    "update": "UpdateOptions",
    "patch": "PatchOptions",
    "delete": "DeleteOptions",
    "deletecollection": "DeleteOptions",
}


def dry_run_requested(verb: str, query: dict[str, str], body_options: Any = None) -> bool:
    """Whether this write is a dry run; raises the real server's 422 for an unknown value."""
    kind = _OPTIONS_KIND.get(verb)
    if kind is None:
        return False  # reads have no dryRun option: the parameter is ignored
    values = [query["dryRun"]] if query.get("dryRun") else []
    if not values and isinstance(body_options, dict):
        values = [str(v) for v in body_options.get("dryRun") or []]
    unsupported = [v for v in values if v != "All"]
    if unsupported:
        shown = GoRaw("[]string{" + ", ".join(f'"{v}"' for v in values) + "}")
        raise invalid_object(kind, "meta.k8s.io", "", [field_not_supported("dryRun", shown, ["All"])])
    return bool(values)
