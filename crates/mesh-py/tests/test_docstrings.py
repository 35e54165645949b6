"""Every public class and method has its documentation in both places a user reads it: the type stubs (``_meshd.pyi``, what an editor shows) and the runtime docstrings (``help()``), and the two say the same about the behaviours a user trips on."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import meshd
import meshd._meshd

STUBS = Path(meshd.__file__).with_name("_meshd.pyi")


def _stub_classes() -> dict[str, ast.ClassDef]:
    tree = ast.parse(STUBS.read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")}


def _public(name: str) -> bool:
    return not name.startswith("_")


def test_every_public_class_and_method_in_the_stubs_has_a_docstring() -> None:
    classes = _stub_classes()
    assert {"CopyConfig", "SlotView", "Mailbox", "Producer", "Consumer"} <= set(classes)
    missing = []
    for cls in classes.values():
        if not ast.get_docstring(cls):
            missing.append(cls.name)
        for f in cls.body:
            if isinstance(f, ast.FunctionDef) and _public(f.name) and not ast.get_docstring(f):
                missing.append(f"{cls.name}.{f.name}")
    assert not missing, f"stubs without a docstring: {missing}"


def test_every_public_runtime_class_and_method_has_a_docstring() -> None:
    missing = []
    for name in meshd.__all__:
        obj = getattr(meshd, name)
        if not inspect.isclass(obj) or issubclass(obj, BaseException):
            continue
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        for attr, value in vars(obj).items():
            # Methods, and properties: Python's `property` and the extension's getters (data descriptors).
            if _public(attr) and (callable(value) or inspect.isdatadescriptor(value)):
                if not (getattr(value, "__doc__", None) or "").strip():
                    missing.append(f"{name}.{attr}")
    assert not missing, f"runtime objects without a docstring: {missing}"


def test_the_stubs_cover_the_extensions_public_classes() -> None:
    runtime = {n for n, v in vars(meshd._meshd).items() if inspect.isclass(v) and _public(n)}
    assert runtime <= set(_stub_classes()), f"classes without stubs: {runtime - set(_stub_classes())}"


def _stub_doc(cls: str, method: str | None = None) -> str:
    node = _stub_classes()[cls]
    if method is not None:
        node = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == method)  # type: ignore[assignment]
    return ast.get_docstring(node) or ""


def test_what_an_end_claimed_without_a_copy_config_uses_is_said_alike() -> None:
    for doc in (meshd.CopyConfig.__doc__ or "", _stub_doc("CopyConfig")):
        flat = " ".join(doc.split())
        assert "a producer ``for_producer``" in flat.replace("`CopyConfig.for_producer`", "``for_producer``"), doc
        assert "for_msg_size" in flat, doc


def test_a_slot_view_says_what_it_is_and_that_a_producers_slot_holds_an_old_message() -> None:
    runtime = meshd.SlotView.__doc__ or ""
    assert "module's comment" not in runtime and "memoryview" in runtime, runtime
    for doc in (runtime, _stub_doc("SlotView"), _stub_doc("Producer", "send_view"), meshd.Producer.send_view.__doc__):
        assert "a lap ago" in " ".join((doc or "").split()), doc


def test_recv_into_is_documented_in_the_stubs() -> None:
    doc = _stub_doc("Consumer", "recv_into")
    assert "msg_size" in doc and "timeout" in doc, doc
