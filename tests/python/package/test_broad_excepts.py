"""No silent broad except in the package: a handler of ``Exception``,
``BaseException`` or everything either re-raises, logs the exception, or
records it, and one that does not re-raise says in a comment why goddp
goes on (training must not stop for what it caught).

The rule, exactly, for each broad handler of python/goddp (``except:``,
``except Exception``, ``except BaseException``, or a tuple holding one;
statements in functions, lambdas or classes defined inside the handler do
not count):

- re-raises: its body holds a ``raise`` statement;
- logs: its body calls ``<obj>.debug/info/warning/error/critical/log/
  exception(...)`` with ``exc_info=`` or with the bound exception among the
  arguments (``.exception`` always carries it);
- records: it binds the exception (``as exc``) and its body reads that name
  (into a reason, a state, a returned value).

A handler that does not re-raise needs a comment within its lines (the
``except`` line included).
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "python" / "goddp"

BROAD = {"Exception", "BaseException"}
LOG_METHODS = {"debug", "info", "warning", "error", "critical", "log", "exception"}


def _is_broad(kind: ast.expr | None) -> bool:
    if kind is None:
        return True
    if isinstance(kind, ast.Tuple):
        return any(_is_broad(k) for k in kind.elts)
    name = kind.attr if isinstance(kind, ast.Attribute) else getattr(kind, "id", None)
    return name in BROAD


def _own_nodes(body: list[ast.stmt]):
    """The nodes of body, not descending into nested functions, lambdas or
    classes (code that the handler defines but does not run)."""
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
    stack: list[ast.AST] = [node for node in body if not isinstance(node, nested)]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, nested))


def _reads(node: ast.AST, name: str | None) -> bool:
    return name is not None and any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in ast.walk(node)
    )


def _logs_it(call: ast.Call, name: str | None) -> bool:
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr not in LOG_METHODS:
        return False
    if func.attr == "exception" or any(k.arg == "exc_info" for k in call.keywords):
        return True
    return any(_reads(arg, name) for arg in call.args)


def verdict(handler: ast.ExceptHandler, comment_lines: set[int]) -> str | None:
    """None when handler keeps the rule; else what it lacks."""
    if not _is_broad(handler.type):
        return None
    nodes = list(_own_nodes(handler.body))
    if any(isinstance(n, ast.Raise) for n in nodes):
        return None
    logs = any(isinstance(n, ast.Call) and _logs_it(n, handler.name) for n in nodes)
    records = any(isinstance(n, ast.Name) and n.id == handler.name and isinstance(n.ctx, ast.Load) for n in nodes)
    if not (logs or records):
        return "swallows the exception: neither re-raises, logs it, nor records it"
    if not comment_lines & set(range(handler.lineno, handler.end_lineno + 1)):
        return "catches broadly without a comment saying why goddp goes on"
    return None


def problems(source: str, label: str) -> list[str]:
    tree = ast.parse(source)
    comments = {
        tok.start[0] for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler):
            why = verdict(node, comments)
            if why is not None:
                out.append(f"{label}:{node.lineno}: {why}")
    return out


def test_no_broad_except_in_the_package_is_silent():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 30
    bad = [p for path in files for p in problems(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)))]
    assert not bad, "broad excepts that break the rule (module doc):\n" + "\n".join(bad)


def test_the_rule_tells_silent_handlers_from_the_others():
    cases = {
        "except Exception:\n    pass": "swallows",
        "except:\n    x = 1  # why": "swallows",
        "except (ValueError, BaseException) as exc:\n    x = 1  # why": "swallows",
        "except Exception as exc:  # why\n    logger.debug('failed')": "swallows",  # not the exception
        "except Exception as exc:  # why\n    def later():\n        raise exc": "swallows",  # never runs here
        "except Exception as exc:\n    reason = str(exc)": "without a comment",
        "except Exception:\n    raise": None,
        "except BaseException as exc:\n    raise Other() from exc": None,
        "except Exception:  # why\n    logger.debug('failed', exc_info=True)": None,
        "except Exception as exc:  # why\n    log.warning('failed: %s', exc)": None,
        "except Exception as exc:\n    # why\n    reason = f'failed ({exc})'": None,
        "except ValueError:\n    pass": None,  # narrow
    }
    for handler, expected in cases.items():
        source = "try:\n    f()\n" + handler + "\n"
        found = problems(source, "case")
        if expected is None:
            assert found == [], (handler, found)
        else:
            assert len(found) == 1 and expected in found[0], (handler, found)
