"""Whether a chat template is blind to the messages' contents: it writes them, but never looks at them.

``hf_lora_ds.data.masking.skeleton`` renders a conversation once and takes every prompt and prefix the label rule needs
from a rendering of the same roles with stand-in contents. That is exact only for a template whose control flow, and all
it writes besides the contents, cannot depend on what the contents say: one that only concatenates a content into its
output (``'<|im_start|>' + message['content'] + '<|im_end|>'``), tests it for being a non-empty string at most, and
never compares, filters, splits, searches, assigns or calls anything on it or on a whole message. This module proves
that from the template's syntax tree, conservatively: whatever it cannot follow (a macro, a message passed to a
filter or assigned to a variable, a content tested with ``in`` or ``|trim``) makes the template not blind, and its
conversations keep the prefix rule.
"""

from __future__ import annotations

import enum

import jinja2
from jinja2 import nodes
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["content_blind"]


class _Kind(enum.IntEnum):
    """What a value may hold; ordered, so the join of two kinds is their max."""

    FREE = 0  # nothing from a message's content
    CONTENT = 1  # a content, or text that contains one
    MESSAGE = 2  # a message, or a list of messages: its content is reachable


class _Looks(Exception):
    """The template looks at a content, or at a message in a way that may read its content."""


_MESSAGE_FILTERS = {
    "first": _Kind.MESSAGE,
    "last": _Kind.MESSAGE,
    "reverse": _Kind.MESSAGE,
    "list": _Kind.MESSAGE,
    "length": _Kind.FREE,
    "count": _Kind.FREE,
}
_CONTENT_TESTS = {"string", "defined", "undefined", "none"}  # the same answer for every non-empty string
_MESSAGE_TESTS = {"defined", "undefined", "none", "mapping", "sequence", "iterable"}
_LOOP_NEIGHBOURS = {"previtem", "nextitem"}
# Globals whose result is the same on every render (``strftime_now``, ``lipsum`` and macros are not, or are unread).
_PURE_CALLS = {"namespace", "range", "dict", "raise_exception", "cycler", "joiner", "loop"}
_UNARY_OR_ARITHMETIC = (nodes.BinExpr, nodes.UnaryExpr)  # after Add, And, Or and Not, which are handled first


def content_blind(template: str) -> bool:
    """Whether ``template`` (Jinja source) provably never looks at a message's content (see the module doc)."""
    try:
        tree = ImmutableSandboxedEnvironment(extensions=[loopcontrols]).parse(template)
        _Walker().statements(tree.body, {"messages": _Kind.MESSAGE})
    except (jinja2.TemplateSyntaxError, _Looks):
        return False
    return True


class _Walker:
    """Walks statements with the kinds of the names in scope, and gives each expression its kind, raising
    ``_Looks`` at the first use of a content or message that is not allowed."""

    def statements(self, body: list[nodes.Node], scope: dict[str, _Kind]) -> None:
        for node in body:
            self.statement(node, scope)

    def statement(self, node: nodes.Node, scope: dict[str, _Kind]) -> None:
        if isinstance(node, nodes.Output):
            if any(self.kind(child, scope) is _Kind.MESSAGE for child in node.nodes):
                raise _Looks("a message written whole")
        elif isinstance(node, nodes.If):
            self.kind(node.test, scope)  # any kind: a truth test of a non-empty content or message is the same
            for branch in (node.body, node.elif_, node.else_):
                self.statements(branch, scope)
        elif isinstance(node, nodes.For):
            self.loop(node, scope)
        elif isinstance(node, nodes.Assign):
            value = self.kind(node.node, scope)
            if value is not _Kind.FREE and not isinstance(node.target, nodes.Name):
                raise _Looks("a content or message unpacked or stored in a namespace")
            for name in _names(node.target):
                scope[name] = max(scope.get(name, _Kind.FREE), value)  # what a name may hold, it still may
        elif not isinstance(node, (nodes.Break, nodes.Continue)):
            raise _Looks(f"a {type(node).__name__} statement")

    def loop(self, node: nodes.For, scope: dict[str, _Kind]) -> None:
        iterated = self.kind(node.iter, scope)
        if iterated is _Kind.CONTENT or (iterated is _Kind.MESSAGE and not isinstance(node.target, nodes.Name)):
            raise _Looks("a loop over a content, or over messages unpacked")
        inner = dict(scope)
        for name in _names(node.target):
            inner[name] = iterated
        if node.test is not None:
            self.kind(node.test, inner)
        self.statements(node.body, inner)
        self.statements(node.else_, scope)

    def kind(self, node: nodes.Expr, scope: dict[str, _Kind]) -> _Kind:
        if isinstance(node, nodes.Name):
            return scope.get(node.name, _Kind.FREE)
        if isinstance(node, (nodes.Const, nodes.TemplateData)):
            return _Kind.FREE
        if isinstance(node, nodes.Getattr):
            return self.field(self.kind(node.node, scope), node.attr, node.node)
        if isinstance(node, nodes.Getitem):
            return self.item(node, scope)
        if isinstance(node, (nodes.Add, nodes.Concat)):
            kinds = [self.kind(child, scope) for child in node.iter_child_nodes()]
            if _Kind.MESSAGE in kinds:
                raise _Looks("a message joined to text")
            return max(kinds)
        if isinstance(node, (nodes.And, nodes.Or)):
            return max(self.kind(node.left, scope), self.kind(node.right, scope))
        if isinstance(node, nodes.CondExpr):
            self.kind(node.test, scope)
            branches = [node.expr1] + ([node.expr2] if node.expr2 is not None else [])
            return max(self.kind(branch, scope) for branch in branches)
        if isinstance(node, nodes.Not):
            self.kind(node.node, scope)  # a truth test
            return _Kind.FREE
        if isinstance(node, (nodes.Filter, nodes.Test)):
            return self.filter_or_test(node, scope)
        if isinstance(node, nodes.Call) and isinstance(node.node, nodes.Name) and node.node.name not in _PURE_CALLS:
            raise _Looks(f"a call of {node.node.name}, which may give another result on another render")
        if isinstance(
            node,
            (
                nodes.Compare,
                nodes.Call,
                nodes.List,
                nodes.Tuple,
                nodes.Dict,
                nodes.Slice,
                nodes.Keyword,
                nodes.Pair,
                nodes.Operand,
                nodes.NSRef,
                *_UNARY_OR_ARITHMETIC,
            ),
        ):
            self.free(node.iter_child_nodes(), scope, type(node).__name__)
            return _Kind.FREE
        raise _Looks(f"a {type(node).__name__} expression")

    def field(self, base: _Kind, name: str, node: nodes.Expr) -> _Kind:
        """The kind of ``base.name`` (or ``base['name']``)."""
        if isinstance(node, nodes.Name) and node.name == "loop" and name in _LOOP_NEIGHBOURS:
            return _Kind.MESSAGE  # conservatively: the loop may be over messages
        if base is _Kind.CONTENT:
            raise _Looks(f"a content's {name!r}")
        if base is _Kind.MESSAGE:
            if name == "content":
                return _Kind.CONTENT
            if any(hasattr(kind, name) for kind in (str, dict, list)):
                raise _Looks(f"a message's method {name!r}")
        return _Kind.FREE

    def item(self, node: nodes.Getitem, scope: dict[str, _Kind]) -> _Kind:
        base = self.kind(node.node, scope)
        if isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
            return self.field(base, node.arg.value, node.node)
        self.free([node.arg], scope, "an index")
        if base is _Kind.CONTENT:
            raise _Looks("a content indexed")
        return base  # an element or a slice of a message list is messages; a key we cannot read is conservatively too

    def filter_or_test(self, node: nodes.Filter | nodes.Test, scope: dict[str, _Kind]) -> _Kind:
        if node.node is None or node.name == "random":
            raise _Looks(f"the filter {node.name}")
        self.free([*node.args, *node.kwargs, node.dyn_args, node.dyn_kwargs], scope, f"the arguments of {node.name}")
        base = self.kind(node.node, scope)
        if base is _Kind.FREE:
            return _Kind.FREE
        if isinstance(node, nodes.Test):
            if node.name in (_CONTENT_TESTS if base is _Kind.CONTENT else _MESSAGE_TESTS):
                return _Kind.FREE
        elif base is _Kind.MESSAGE and node.name in _MESSAGE_FILTERS:
            return _MESSAGE_FILTERS[node.name]
        raise _Looks(f"{node.name!r} applied to a content or message")

    def free(self, children, scope: dict[str, _Kind], what: str) -> None:
        """Every child (None skipped) must hold nothing of a message."""
        for child in children:
            if child is not None and self.kind(child, scope) is not _Kind.FREE:
                raise _Looks(f"a content or message in {what}")


def _names(target: nodes.Expr) -> list[str]:
    """The names a loop or assignment target binds (``x``, ``k, v``; ``ns.x`` binds none)."""
    found = [target] if isinstance(target, nodes.Name) else target.find_all(nodes.Name)
    return [name.name for name in found]
