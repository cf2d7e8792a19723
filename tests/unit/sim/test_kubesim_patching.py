"""The patch formats kubesim applies (sim/kubesim/patching.py), without a server.

Merge patch is held to RFC 7386 (its Appendix A examples), JSON patch to RFC
6902 (its Appendix A examples), and the strategic merge patch to what the
module promises: `$patch`, `$retainKeys` honoured, `$setElementOrder/...`
dropped, lists replaced whole.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubesim.patching import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    PatchError,
    apply_patch,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)


# ----- RFC 7386 -------------------------------------------------------------
@pytest.mark.parametrize(
    ("target", "patch", "result"),
    [
        # RFC 7386 Appendix A, in order.
        ({"a": "b"}, {"a": "c"}, {"a": "c"}),
        ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
        ({"a": "b"}, {"a": None}, {}),
        ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
        ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
        ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
        ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
        ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
        (["a", "b"], ["c", "d"], ["c", "d"]),
        ({"a": "b"}, ["c"], ["c"]),
        ({"a": "foo"}, None, None),
        ({"a": "foo"}, "bar", "bar"),
        ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
        ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
        ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
        # RFC 7386 section 3's example.
        (
            {"title": "Goodbye!", "author": {"givenName": "John", "familyName": "Doe"}, "tags": ["example", "sample"],
             "content": "This will be unchanged"},
            {"title": "Hello!", "phoneNumber": "+01-123-456-7890", "author": {"familyName": None}, "tags": ["example"]},
            {"title": "Hello!", "author": {"givenName": "John"}, "tags": ["example"], "content": "This will be unchanged",
             "phoneNumber": "+01-123-456-7890"},
        ),
    ],
)  # fmt: skip
def test_merge_patch_rfc7386_examples(target: Any, patch: Any, result: Any) -> None:
    before = copy.deepcopy(target)
    assert merge_patch(target, patch) == result
    assert target == before  # the target is not modified in place


# Keys never start with "$": those are strategic merge patch directives.
keys = st.text(st.characters(exclude_characters="$", exclude_categories=["Cs"]), max_size=3)
json_leaf = st.booleans() | st.integers() | st.text(max_size=5)
json_no_null = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=12,
)
json_objects = st.dictionaries(keys, json_no_null, max_size=4)


def make_merge_patch(source: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that turns `source` into `target` (null-free documents)."""
    patch: dict[str, Any] = {key: None for key in source if key not in target}
    for key, value in target.items():
        old = source.get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            sub = make_merge_patch(old, value)
            if sub:
                patch[key] = sub
        elif key not in source or old != value or type(old) is not type(value):
            patch[key] = value
    return patch


@given(json_objects, json_objects)
def test_merge_patch_applies_a_derived_patch(source: dict[str, Any], target: dict[str, Any]) -> None:
    assert merge_patch(source, make_merge_patch(source, target)) == target


@given(json_objects)
def test_merge_patch_of_a_document_with_itself_is_the_document(doc: dict[str, Any]) -> None:
    assert merge_patch(doc, doc) == doc
    assert merge_patch(doc, {}) == doc


# ----- RFC 6902 -------------------------------------------------------------
@pytest.mark.parametrize(
    ("doc", "ops", "result"),
    [
        # RFC 6902 Appendix A, in order (A.9, A.12, A.13 and A.15 are errors: below).
        ({"foo": "bar"}, [{"op": "add", "path": "/baz", "value": "qux"}], {"baz": "qux", "foo": "bar"}),
        ({"foo": ["bar", "baz"]}, [{"op": "add", "path": "/foo/1", "value": "qux"}], {"foo": ["bar", "qux", "baz"]}),
        ({"baz": "qux", "foo": "bar"}, [{"op": "remove", "path": "/baz"}], {"foo": "bar"}),
        ({"foo": ["bar", "qux", "baz"]}, [{"op": "remove", "path": "/foo/1"}], {"foo": ["bar", "baz"]}),
        ({"baz": "qux", "foo": "bar"}, [{"op": "replace", "path": "/baz", "value": "boo"}], {"baz": "boo", "foo": "bar"}),
        (
            {"foo": {"bar": "baz", "waldo": "fred"}, "qux": {"corge": "grault"}},
            [{"op": "move", "from": "/foo/waldo", "path": "/qux/thud"}],
            {"foo": {"bar": "baz"}, "qux": {"corge": "grault", "thud": "fred"}},
        ),
        (
            {"foo": ["all", "grass", "cows", "eat"]},
            [{"op": "move", "from": "/foo/1", "path": "/foo/3"}],
            {"foo": ["all", "cows", "eat", "grass"]},
        ),
        (
            {"baz": "qux", "foo": ["a", 2, "c"]},
            [{"op": "test", "path": "/baz", "value": "qux"}, {"op": "test", "path": "/foo/1", "value": 2}],
            {"baz": "qux", "foo": ["a", 2, "c"]},
        ),
        ({"foo": "bar"}, [{"op": "add", "path": "/child", "value": {"grandchild": {}}}],
         {"foo": "bar", "child": {"grandchild": {}}}),
        ({"foo": "bar"}, [{"op": "add", "path": "/baz", "value": "qux", "xyz": 123}], {"foo": "bar", "baz": "qux"}),
        ({"/": 9, "~1": 10}, [{"op": "test", "path": "/~01", "value": 10}], {"/": 9, "~1": 10}),
        ({"foo": ["bar"]}, [{"op": "add", "path": "/foo/-", "value": ["abc", "def"]}], {"foo": ["bar", ["abc", "def"]]}),
        # copy, the whole document, the escapes.
        ({"a": {"b": 1}}, [{"op": "copy", "from": "/a", "path": "/c"}], {"a": {"b": 1}, "c": {"b": 1}}),
        ({"a": 1}, [{"op": "replace", "path": "", "value": {"b": 2}}], {"b": 2}),
        ({"a/b": 1, "m~n": 2}, [{"op": "remove", "path": "/a~1b"}, {"op": "replace", "path": "/m~0n", "value": 3}],
         {"m~n": 3}),
        ({"n": 1}, [{"op": "test", "path": "/n", "value": 1.0}], {"n": 1}),  # numbers compare by value
        ({"a": 1}, [], {"a": 1}),
        # The patch kube-storage-version-migrator style clients send: a precondition and a no-op.
        ({"metadata": {"resourceVersion": "7"}},
         [{"op": "test", "path": "/metadata/resourceVersion", "value": "7"}],
         {"metadata": {"resourceVersion": "7"}}),
    ],
)  # fmt: skip
def test_json_patch_rfc6902_examples(doc: Any, ops: list[dict[str, Any]], result: Any) -> None:
    before = copy.deepcopy(doc)
    assert json_patch(doc, ops) == result
    assert doc == before


def test_copy_is_a_deep_copy() -> None:
    patched = json_patch({"a": {"b": [1]}}, [{"op": "copy", "from": "/a", "path": "/c"}])
    patched["c"]["b"].append(2)
    assert patched["a"] == {"b": [1]}


@pytest.mark.parametrize(
    ("doc", "ops"),
    [
        ({"baz": "qux"}, [{"op": "test", "path": "/baz", "value": "bar"}]),  # A.9
        ({"foo": "bar"}, [{"op": "add", "path": "/baz/bat", "value": "qux"}]),  # A.12
        ({"/": 9, "~1": 10}, [{"op": "test", "path": "/~01", "value": "10"}]),  # A.15
        ({"a": 1}, [{"op": "test", "path": "/a", "value": True}]),  # a boolean is not a number
        ({"a": True}, [{"op": "test", "path": "/a", "value": 1}]),
        ({"a": 0}, [{"op": "test", "path": "/a", "value": False}]),
        ({"a": [1]}, [{"op": "test", "path": "/a", "value": [True]}]),
        ({"a": 1}, [{"op": "remove", "path": "/b"}]),
        ({"a": 1}, [{"op": "replace", "path": "/b", "value": 2}]),
        ({"a": [1, 2]}, [{"op": "add", "path": "/a/5", "value": 3}]),
        ({"a": [1, 2]}, [{"op": "replace", "path": "/a/2", "value": 3}]),
        ({"a": [1, 2]}, [{"op": "remove", "path": "/a/-"}]),
        ({"a": 1}, [{"op": "add", "path": "a", "value": 2}]),  # not a JSON pointer
        ({"a": 1}, [{"op": "remove", "path": ""}]),
        ({"a": 1}, [{"op": "frobnicate", "path": "/a"}]),
        ({"a": 1}, [{"op": "add", "value": 2}]),  # no path
        ({"a": 1}, [{"path": "/a"}]),  # no op
        ({"a": 1}, ["add"]),
        ({"a": 1}, {"op": "add", "path": "/b", "value": 2}),  # not a list
        ({"a": 1}, [{"op": "move", "from": "/nope", "path": "/b"}]),
        ({"a": {"b": 1}}, [{"op": "move", "from": "/a", "path": "/a/c"}]),  # into its own child
        ({"a": "text"}, [{"op": "add", "path": "/a/b", "value": 1}]),
    ],
)
def test_json_patch_errors(doc: Any, ops: Any) -> None:
    before = copy.deepcopy(doc)
    with pytest.raises(PatchError):
        json_patch(doc, ops)
    assert doc == before  # a failed patch leaves the document alone


def test_json_patch_is_all_or_nothing() -> None:
    doc = {"a": 1}
    with pytest.raises(PatchError):
        json_patch(doc, [{"op": "add", "path": "/b", "value": 2}, {"op": "test", "path": "/a", "value": 9}])
    assert doc == {"a": 1}


# ----- strategic merge patch (an approximation) ----------------------------
@pytest.mark.parametrize(
    ("target", "patch", "result"),
    [
        # maps merge as in a merge patch, null deletes
        ({"a": {"b": 1, "c": 2}}, {"a": {"b": 3, "c": None}}, {"a": {"b": 3}}),
        # lists are replaced whole (kube-apiserver would merge containers by name)
        ({"l": [{"name": "x", "v": 1}, {"name": "y"}]}, {"l": [{"name": "x", "v": 2}]}, {"l": [{"name": "x", "v": 2}]}),
        # $patch: replace replaces the map it sits in
        ({"spec": {"a": 1, "b": 2}}, {"spec": {"$patch": "replace", "c": 3}}, {"spec": {"c": 3}}),
        # $patch: delete removes the map it sits in
        ({"spec": {"a": 1}, "keep": True}, {"spec": {"$patch": "delete"}}, {"keep": True}),
        # $retainKeys keeps only the listed keys of the merged map
        ({"strategy": {"type": "Recreate", "rollingUpdate": {"maxSurge": 1}}},
         {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}},
         {"strategy": {"type": "Recreate"}}),
        ({"s": {"a": 1, "b": 2}}, {"s": {"$retainKeys": ["a", "c"], "c": 3}}, {"s": {"a": 1, "c": 3}}),
        # $setElementOrder/... and $deleteFromPrimitiveList/... are dropped
        ({"spec": {"containers": [{"name": "a"}]}},
         {"spec": {"$setElementOrder/containers": [{"name": "a"}], "containers": [{"name": "a", "image": "i"}]}},
         {"spec": {"containers": [{"name": "a", "image": "i"}]}}),
        ({"metadata": {"finalizers": ["f"]}}, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["f"]}},
         {"metadata": {"finalizers": ["f"]}}),
        # kubectl apply's last-applied annotation travels as a plain map merge
        ({"metadata": {"annotations": {"x": "1"}}}, {"metadata": {"annotations": {"y": "2"}}},
         {"metadata": {"annotations": {"x": "1", "y": "2"}}}),
    ],
)  # fmt: skip
def test_strategic_merge_patch(target: dict[str, Any], patch: dict[str, Any], result: dict[str, Any]) -> None:
    before = copy.deepcopy(target)
    assert strategic_merge_patch(target, patch) == result
    assert target == before


@given(json_objects, json_objects)
def test_strategic_merge_without_directives_is_a_merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> None:
    assert strategic_merge_patch(target, patch) == merge_patch(target, patch)


# ----- dispatch -------------------------------------------------------------
@pytest.mark.parametrize(
    ("content_type", "patch", "result"),
    [
        (MERGE_PATCH, {"b": 2, "a": None}, {"b": 2}),
        (STRATEGIC_MERGE_PATCH, {"b": 2, "$retainKeys": ["b"]}, {"b": 2}),
        (JSON_PATCH, [{"op": "add", "path": "/b", "value": 2}], {"a": 1, "b": 2}),
    ],
)
def test_apply_patch_dispatches_on_content_type(content_type: str, patch: Any, result: dict[str, Any]) -> None:
    assert apply_patch(content_type, {"a": 1}, patch) == result


@pytest.mark.parametrize("content_type", [APPLY_PATCH, "application/json", ""])
def test_apply_patch_refuses_other_types(content_type: str) -> None:
    with pytest.raises(PatchError, match="unsupported patch type"):
        apply_patch(content_type, {"a": 1}, {"a": 2})
