"""kubesim's structural-schema pruning, OpenAPI validation and CEL rules, as pure functions.

Each expectation is the text kube-apiserver v1.36 prints: field errors as
apimachinery's `field.Error` words them (`ErrorBody`), schema errors as
apiextensions-apiserver's `kubeOpenAPIResultToFieldErrors` maps kube-openapi's,
CEL failures as `pkg/apiserver/schema/cel/validation.go` reports them.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesim import cel, crds, schemas
from kubesim.errors import StatusError

CRD_DIR = Path(__file__).resolve().parents[3] / "deployments" / "crds"


def crd(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((CRD_DIR / f"{name}.yaml").read_text()))


def schema_of(name: str) -> dict[str, Any]:
    return dict(crd(name)["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


SVM = schema_of("storageversionmigrations")
STATE = schema_of("storagestates")


def svm(**extra: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "migration.k8s.io/v1alpha1",
        "kind": "StorageVersionMigration",
        "metadata": {"name": "m"},
        "spec": {"resource": {"group": "apps", "version": "v1", "resource": "deployments"}},
    }
    obj.update(extra)
    return obj


def texts(obj: dict[str, Any], schema: dict[str, Any], old: Any = schemas.MISSING) -> list[str]:
    return [str(e) for e in schemas.validate(obj, schema, old)]


# ----- validation -------------------------------------------------------------

TYPES: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "minLength": 2, "maxLength": 5, "pattern": "^[a-z]+$"},
                "count": {"type": "integer", "minimum": 0, "maximum": 10},
                "ratio": {"type": "number", "exclusiveMaximum": True, "maximum": 1},
                "on": {"type": "boolean"},
                "when": {"type": "string", "format": "date-time"},
                "port": {"x-kubernetes-int-or-string": True},
                "maybe": {"type": "string", "nullable": True},
                "tags": {"type": "array", "maxItems": 2, "items": {"type": "string", "enum": ["a", "b"]}},
                "labels": {"type": "object", "additionalProperties": {"type": "integer"}},
            },
        }
    },
}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"name": "ok"}, []),
        ({}, ["spec.name: Required value"]),
        (
            {"name": 5},
            ['spec.name: Invalid value: "integer": spec.name in body must be of type string: "integer"'],
        ),
        ({"name": "a"}, ['spec.name: Invalid value: "a": spec.name in body should be at least 2 chars long']),
        ({"name": "abcdef"}, ["spec.name: Too long: may not be more than 5 bytes"]),
        ({"name": "AB"}, ["spec.name: Invalid value: \"AB\": spec.name in body should match '^[a-z]+$'"]),
        ({"name": "ok", "count": 11}, ["spec.count: Invalid value: 11: spec.count in body should be less than or equal to 10"]),
        ({"name": "ok", "count": -1}, ["spec.count: Invalid value: -1: spec.count in body should be greater than or equal to 0"]),
        ({"name": "ok", "count": 2.0}, []),
        ({"name": "ok", "count": 2.5}, ['spec.count: Invalid value: "number": spec.count in body must be of type integer: "number"']),
        ({"name": "ok", "ratio": 1}, ["spec.ratio: Invalid value: 1: spec.ratio in body should be less than 1"]),
        ({"name": "ok", "on": "yes"}, ['spec.on: Invalid value: "string": spec.on in body must be of type boolean: "string"']),
        ({"name": "ok", "when": "2024-01-02T03:04:05Z"}, []),
        ({"name": "ok", "when": "soon"}, ['spec.when: Invalid value: "soon": spec.when in body must be of type date-time: "soon"']),
        ({"name": "ok", "port": 80}, []),
        ({"name": "ok", "port": "http"}, []),
        ({"name": "ok", "port": True}, ['spec.port: Invalid value: "boolean": spec.port in body must be of type integer,string: "boolean"']),
        ({"name": "ok", "maybe": None}, []),
        ({"name": None}, ['spec.name: Invalid value: "null": spec.name in body must be of type string: "null"']),
        ({"name": "ok", "tags": ["a", "c"]}, ['spec.tags[1]: Unsupported value: "c": supported values: "a", "b"']),
        ({"name": "ok", "tags": ["a", "b", "a"]}, ["spec.tags: Too many: 3: must have at most 2 items"]),
        ({"name": "ok", "labels": {"x": 1, "y": "2"}}, ['spec.labels.y: Invalid value: "string": spec.labels.y in body must be of type integer: "string"']),
        ("nope", ['spec: Invalid value: "string": spec in body must be of type object: "string"']),
    ],
)  # fmt: skip
def test_schema_errors_as_kube_apiserver_prints_them(spec: Any, expected: list[str]) -> None:
    """kubeOpenAPIResultToFieldErrors: RequiredFailCode → field.Required, EnumFailCode →
    field.NotSupported, TooLongFailCode → field.TooLong, MaxItemsFailCode → field.TooMany,
    InvalidTypeCode → field.TypeInvalid(path, value, err.Error()), the rest field.Invalid."""
    assert texts({"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "n"}, "spec": spec}, TYPES) == expected


def test_enum_in_status_is_not_supported_with_the_reference_wording() -> None:
    """The brief's example: `status.phase: Unsupported value: "Bogus": supported values:
    "Pending", "Running", "Succeeded", "Failed"` with reason FieldValueNotSupported."""
    errors = schemas.validate(svm(status={"phase": "Bogus"}), SVM)
    assert [(e.type, e.field, e.body()) for e in errors] == [
        (
            "FieldValueNotSupported",
            "status.phase",
            'Unsupported value: "Bogus": supported values: "Pending", "Running", "Succeeded", "Failed"',
        )
    ]


def test_unchanged_values_are_not_validated_again() -> None:
    """CRDValidationRatcheting (GA in v1.33): an update leaves a stored invalid value alone."""
    old = svm(status={"phase": "Bogus"})
    assert texts(copy.deepcopy(old), SVM, old) == []
    changed = svm(status={"phase": "Bogus", "progress": {"listed": -1}})
    assert texts(changed, SVM, old) == [
        "status.progress.listed: Invalid value: -1: status.progress.listed in body should be greater than or equal to 0"
    ]


# ----- pruning ----------------------------------------------------------------


def test_pruning_drops_undeclared_fields_at_every_level() -> None:
    """Structural schema pruning: fields not in `properties` go; apiVersion, kind and metadata
    stay at the root, metadata reduced to ObjectMeta's fields."""
    obj = svm(extra=1, status={"phase": "Running", "bogus": {"a": 1}, "progress": {"listed": 3, "nope": 1}})
    obj["metadata"]["unknownMeta"] = "x"
    obj["spec"]["resource"]["kind"] = "Deployment"
    schemas.prune(obj, SVM)
    assert obj == {
        "apiVersion": "migration.k8s.io/v1alpha1",
        "kind": "StorageVersionMigration",
        "metadata": {"name": "m"},
        "spec": {"resource": {"group": "apps", "version": "v1", "resource": "deployments"}},
        "status": {"phase": "Running", "progress": {"listed": 3}},
    }


def test_pruning_keeps_preserved_and_map_fields() -> None:
    schema = {
        "type": "object",
        "properties": {
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {"a": {"type": "object"}}},
            "map": {"type": "object", "additionalProperties": {"type": "object", "properties": {"k": {"type": "string"}}}},
            "any": {"type": "object", "additionalProperties": True},
            "closed": {"type": "object"},
        },
    }  # fmt: skip
    obj = {
        "free": {"a": {"dropped": 1}, "kept": {"deep": 1}},
        "map": {"x": {"k": "v", "dropped": 2}},
        "any": {"y": {"z": 1}},
        "closed": {"gone": 1},
    }
    schemas.prune(obj, schema)
    assert obj == {
        "free": {"a": {}, "kept": {"deep": 1}},
        "map": {"x": {"k": "v"}},
        "any": {"y": {"z": 1}},
        "closed": {},
    }


# ----- CEL --------------------------------------------------------------------


SVM_RESOURCE_RULE = (
    "(has(self.group) ? self.group : '') == (has(oldSelf.group) ? oldSelf.group : '') && "
    "(has(self.version) ? self.version : '') == (has(oldSelf.version) ? oldSelf.version : '') && "
    "self.resource == oldSelf.resource"
)
STATE_RESOURCE_RULE = (
    "(has(self.group) ? self.group : '') == (has(oldSelf.group) ? oldSelf.group : '') && "
    "self.resource == oldSelf.resource"
)
SVM_IMMUTABLE = (
    'spec.resource: Invalid value: "object": spec.resource is immutable; '
    "create another StorageVersionMigration to migrate another resource"
)
STATE_IMMUTABLE = (
    'spec.resource: Invalid value: "object": spec.resource is immutable; '
    "create another StorageState, named after the other resource"
)


def test_immutable_resource_is_a_transition_rule() -> None:
    """Our CRD: spec.resource is immutable with the defaults applied (issue 19, item 6), a
    transition rule. The real server: field.Invalid(path, sts.Type, message), printed
    `spec.resource: Invalid value: "object": <message>`."""
    rules = SVM["properties"]["spec"]["properties"]["resource"]["x-kubernetes-validations"]
    assert [r["rule"] for r in rules] == [SVM_RESOURCE_RULE]
    old = svm()
    new = svm(spec={"resource": {"group": "", "version": "v1", "resource": "secrets"}})
    assert cel.validate(svm(), SVM) == []  # no oldSelf on create: a transition rule does not run
    assert cel.validate(copy.deepcopy(old), SVM, old) == []
    errors = cel.validate(new, SVM, old)
    assert [str(e) for e in errors] == [SVM_IMMUTABLE]
    assert errors[0].type == "FieldValueInvalid"


def _with_resource(obj: dict[str, Any], resource: dict[str, str]) -> dict[str, Any]:
    return {**obj, "spec": {**obj["spec"], "resource": resource}}


# Issue 19, item 6: "Our CRD's rule that `spec.resource` is immutable (`self == oldSelf`) treats an
# omitted `group` and `group: ""` as different. Go clients omit empty strings (`omitempty`) [...]
# Compare with the defaults applied (an empty group equals no group)."
@pytest.mark.parametrize(
    ("old", "new", "ok"),
    [
        # the defaults applied: omitted == "", both ways, for group and for version
        ({"group": "", "version": "v1", "resource": "secrets"}, {"version": "v1", "resource": "secrets"}, True),
        ({"version": "v1", "resource": "secrets"}, {"group": "", "version": "v1", "resource": "secrets"}, True),
        ({"group": "", "version": "", "resource": "secrets"}, {"resource": "secrets"}, True),
        ({"resource": "secrets"}, {"group": "", "version": "", "resource": "secrets"}, True),
        ({"group": "apps", "version": "v1", "resource": "deployments"},
         {"group": "apps", "version": "v1", "resource": "deployments"}, True),
        # every real change is refused
        ({"group": "apps", "version": "v1", "resource": "deployments"}, {"group": "", "version": "v1", "resource": "deployments"}, False),
        ({"group": "apps", "version": "v1", "resource": "deployments"}, {"version": "v1", "resource": "deployments"}, False),
        ({"version": "v1", "resource": "deployments"}, {"group": "apps", "version": "v1", "resource": "deployments"}, False),
        ({"group": "", "version": "v1", "resource": "secrets"}, {"group": "", "version": "v1", "resource": "configmaps"}, False),
        ({"group": "", "version": "v1", "resource": "secrets"}, {"group": "", "version": "v2", "resource": "secrets"}, False),
        ({"group": "", "version": "v1", "resource": "secrets"}, {"group": "", "resource": "secrets"}, False),
        ({"resource": "secrets"}, {"version": "v1", "resource": "secrets"}, False),
    ],
)  # fmt: skip
def test_migration_resource_is_immutable_with_the_defaults_applied(
    old: dict[str, str], new: dict[str, str], ok: bool
) -> None:
    before = _with_resource(svm(), old)
    after = _with_resource(svm(spec={"continueToken": "t"}), new)
    got = [str(e) for e in cel.validate(after, SVM, before)]
    assert got == ([] if ok else [SVM_IMMUTABLE])


@pytest.mark.parametrize(
    ("old", "new", "ok"),
    [
        ({"group": "", "resource": "secrets"}, {"resource": "secrets"}, True),
        ({"resource": "secrets"}, {"group": "", "resource": "secrets"}, True),
        ({"group": "apps", "resource": "deployments"}, {"group": "apps", "resource": "deployments"}, True),
        ({"group": "apps", "resource": "deployments"}, {"group": "", "resource": "deployments"}, False),
        ({"group": "apps", "resource": "deployments"}, {"resource": "deployments"}, False),
        ({"resource": "secrets"}, {"resource": "configmaps"}, False),
    ],
)  # fmt: skip
def test_storage_state_resource_is_immutable_with_the_defaults_applied(
    old: dict[str, str], new: dict[str, str], ok: bool
) -> None:
    rules = STATE["properties"]["spec"]["properties"]["resource"]["x-kubernetes-validations"]
    assert [r["rule"] for r in rules] == [STATE_RESOURCE_RULE]
    # Through the spec.resource schema alone: the root's name rule is another matter.
    schema = STATE["properties"]["spec"]
    got = [str(e) for e in cel.validate({"resource": new}, schema, {"resource": old})]
    assert got == ([] if ok else [STATE_IMMUTABLE.replace("spec.resource:", "resource:", 1)])


def test_the_immutability_rule_compiles_and_runs_only_on_update() -> None:
    """A CRD carrying it is accepted (kubesim refuses a rule that does not compile, as the real
    server does); on create, and where no old value exists, a transition rule does not run."""
    for name in ("storageversionmigrations", "storagestates"):
        crds.validate_crd(crd(name))
    for rule in (SVM_RESOURCE_RULE, STATE_RESOURCE_RULE):
        cel.compile_rule(rule)
    assert cel.validate(svm(spec={"resource": {"resource": "secrets"}}), SVM) == []
    # The rule's own runtime error, were oldSelf to lack the required field: no silent pass.
    got = [str(e) for e in cel.validate({"resource": {"resource": "s"}}, SVM["properties"]["spec"], {"resource": {}})]
    assert got == [
        'resource: Invalid value: "object": no such key: resource evaluating rule: spec.resource is immutable; '
        "create another StorageVersionMigration to migrate another resource"
    ]


def test_self_equals_old_self_on_the_root_sees_only_name_and_generate_name() -> None:
    """The `self == oldSelf` shortcut sees the root as CEL does: metadata reduced to name and
    generateName, so a changed label or resourceVersion is not a change."""
    schema = {"type": "object", "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "frozen"}],
              "properties": {"metadata": {"type": "object"}, "spec": {"type": "object", "properties": {"a": {"type": "string"}}}}}  # fmt: skip
    old = {"metadata": {"name": "x", "resourceVersion": "1"}, "spec": {"a": "1"}}
    relabeled = {"metadata": {"name": "x", "resourceVersion": "2", "labels": {"k": "v"}}, "spec": {"a": "1"}}
    assert cel.validate(relabeled, schema, old) == []
    changed = {"metadata": {"name": "x", "resourceVersion": "2"}, "spec": {"a": "2"}}
    assert [str(e) for e in cel.validate(changed, schema, old)] == ['<nil>: Invalid value: "object": frozen']


@pytest.mark.parametrize(
    ("name", "resource", "ok"),
    [("deployments.apps", {"group": "apps", "resource": "deployments"}, True),
     ("secrets", {"resource": "secrets"}, True),
     ("secrets", {"group": "", "resource": "secrets"}, True),
     ("wrong", {"group": "apps", "resource": "deployments"}, False)],
)  # fmt: skip
def test_storage_state_name_rule_on_the_root(name: str, resource: dict[str, str], ok: bool) -> None:
    """A rule on the root has a nil path, which Go prints `<nil>` (as in `The Foo "x" is
    invalid: <nil>: Invalid value: "object": ...` from real servers)."""
    obj = {"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState", "metadata": {"name": name},
           "spec": {"resource": resource}}  # fmt: skip
    got = [str(e) for e in cel.validate(obj, STATE)]
    if ok:
        assert got == []
    else:
        assert got == [
            '<nil>: Invalid value: "object": metadata.name must be "<spec.resource.resource>.<spec.resource.group>", '
            'or "<spec.resource.resource>" for the core group'
        ]


RULES: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "x-kubernetes-validations": [
                {"rule": "self.min <= self.max", "message": "min must not exceed max", "fieldPath": ".min"},
                {"rule": "self.max < 100"},
                {"rule": "self.mode != 'off'", "reason": "FieldValueForbidden", "message": "off is gone"},
                {"rule": "self.missing == 1", "message": "needs missing"},
            ],
            "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}, "mode": {"type": "string"},
                           "missing": {"type": "integer"}},
        }
    },
}  # fmt: skip


def test_rule_failures_reasons_field_paths_and_runtime_errors() -> None:
    obj = {"spec": {"min": 300, "max": 200, "mode": "off"}}
    assert [str(e) for e in cel.validate(obj, RULES)] == [
        'spec.min: Invalid value: "object": min must not exceed max',
        'spec: Invalid value: "object": failed rule: self.max < 100',
        "spec: Forbidden: off is gone",
        'spec: Invalid value: "object": no such key: missing evaluating rule: needs missing',
    ]


def test_a_type_error_blocks_the_rules() -> None:
    """customResourceStrategy.Validate: `hasBlockingErr` — with a FieldValueTypeInvalid error the
    rules are not run, and one error says so."""
    obj = svm(spec={"resource": {"resource": 5}})
    with pytest.raises(StatusError) as caught:
        crds.admit_custom_resource("StorageVersionMigration", "migration.k8s.io", obj, SVM, svm())
    assert caught.value.code == 422
    assert [c["message"] for c in caught.value.details["causes"]] == [  # type: ignore[index]
        'Invalid value: "integer": spec.resource.resource in body must be of type string: "integer"',
        'Invalid value: "null": ' + cel.BLOCKED,
    ]


def test_rules_compile_once() -> None:
    cel.compile_rule.cache_clear()
    old = svm()
    for _ in range(3):
        cel.validate(svm(), STATE, old)
    assert cel.compile_rule.cache_info().misses <= 1


# ----- CRDs -------------------------------------------------------------------


def bars(annotation: str | None) -> dict[str, Any]:
    doc = crd("storageversionmigrations")
    doc["metadata"] = {"name": "gadgets.bars.k8s.io"}
    if annotation is not None:
        doc["metadata"]["annotations"] = {crds.APPROVAL_ANNOTATION: annotation}
    doc["spec"]["group"] = "bars.k8s.io"
    doc["spec"]["names"]["plural"] = "gadgets"
    return doc


@pytest.mark.parametrize(
    ("annotation", "old", "expected"),
    [
        (None, None, ("FieldValueRequired", 'Required value: protected groups must have approval annotation "api-approved.kubernetes.io", see https://github.com/kubernetes/enhancements/pull/1111')),
        ("invalid", None, ("FieldValueInvalid", 'Invalid value: "invalid": protected groups must have approval annotation "api-approved.kubernetes.io" with either a URL or a reason starting with "unapproved", see https://github.com/kubernetes/enhancements/pull/1111')),
        ("https://github.com/kubernetes/kubernetes/pull/79724", None, None),
        ("unapproved, other reason", None, None),
        ("invalid", "invalid", None),  # the approval state did not change: never refused on update
        (None, "", None),
        (None, "invalid", ("FieldValueRequired", 'Required value: protected groups must have approval annotation "api-approved.kubernetes.io", see https://github.com/kubernetes/enhancements/pull/1111')),
    ],
)  # fmt: skip
def test_api_approval_as_validateAPIApproval(
    annotation: str | None, old: str | None, expected: tuple[str, str] | None
) -> None:
    """apiextensions-apiserver TestValidateAPIApproval's table: "ignore non-k8s group",
    "invalid annotation create", "invalid annotation update", "invalid annotation to missing",
    "missing annotation update", "url", "unapproved"."""
    old_crd = None if old is None else bars(old)
    if expected is None:
        crds.validate_crd(bars(annotation), old_crd)
        return
    with pytest.raises(StatusError) as caught:
        crds.validate_crd(bars(annotation), old_crd)
    causes = caught.value.details["causes"]  # type: ignore[index]
    assert [(c["reason"], c["message"], c["field"]) for c in causes] == [
        (*expected, "metadata.annotations[api-approved.kubernetes.io]")
    ]


def test_unprotected_groups_need_no_annotation() -> None:
    doc = bars(None)
    doc["metadata"]["name"] = "gadgets.bars.example.com"
    doc["spec"]["group"] = "bars.example.com"
    crds.validate_crd(doc)


def test_unapproved_is_accepted_with_a_false_condition() -> None:
    """KubernetesAPIApprovalPolicyConformant controller: "unapproved..." → False, UnapprovedAnnotation."""
    conditions = crds.crd_status(bars("unapproved, testing"), None)["conditions"]
    assert {k: conditions[-1][k] for k in ("type", "status", "reason", "message")} == {
        "type": "KubernetesAPIApprovalPolicyConformant",
        "status": "False",
        "reason": "UnapprovedAnnotation",
        "message": 'not approved: "unapproved, testing"',
    }


def test_a_rule_that_does_not_compile_refuses_the_crd() -> None:
    doc = crd("storageversionmigrations")
    doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"] = [
        {"rule": "self.x >"}
    ]
    with pytest.raises(StatusError) as caught:
        crds.validate_crd(doc)
    (cause,) = caught.value.details["causes"]  # type: ignore[index]
    assert cause["field"] == "spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule"
    assert "compilation failed: ERROR: <input>:1:" in cause["message"]


def test_our_crds_are_valid() -> None:
    for name in ("storageversionmigrations", "storagestates"):
        crds.validate_crd(crd(name))
