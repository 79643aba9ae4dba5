"""``equivtool audit MODULE:FN --runs N``: :func:`equivtool.audit_determinism` from the command line."""

from __future__ import annotations

import traceback
from typing import Optional

from equivtool.cli.common import (EXIT_DIFFERENT, EXIT_OK, UsageError, check_no_arguments, check_output_path,
                                  importable_cwd, load_target)


def _check_runs(runs) -> int:
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise UsageError(f"--runs: expected an int >= 2 (a single run cannot be compared), got {runs!r}")
    return runs


def audit_main(target: str, runs: int, json_path: Optional[str] = None, html_path: Optional[str] = None) -> int:
    """``equivtool audit MODULE:FN --runs N``: print the report; 0 if it passed, 1 if not.

    ``MODULE:FN`` names a zero-argument callable (a plain function, a
    ``tf.function``, or any attribute path ``MODULE:obj.method``) that performs
    the step and returns its tensors; it is imported from the current
    directory too. The state to restore is found as
    :func:`equivtool.audit_determinism` finds it (what FN captures, its
    tf.function graph, a captured session); FN may say more with attributes:

    ``FN.audit_variables``
        the variables (or a zero-argument callable returning them);
    ``FN.audit_endpoints``
        the ``endpoints`` argument (a key of FN's returned dict, or a callable).

    A bad target (its module cannot be imported, unknown attribute, not
    callable, needs arguments, raises when run) raises :class:`UsageError`
    (a ``ValueError``) with a one-line message: the CLI exits with code 2.
    """
    from equivtool.cli.progress import write_reports
    from equivtool._base.stack import innermost_user_frame
    from equivtool.determinism import audit_determinism

    runs = _check_runs(runs)
    check_output_path(json_path, "--json")
    check_output_path(html_path, "--html")
    with importable_cwd():
        fn = load_target(target, "MODULE:FN")
        check_no_arguments(fn, target)
        variables = getattr(fn, "audit_variables", None)
        if callable(variables) and not hasattr(variables, "variables"):
            variables = variables()
        endpoints = getattr(fn, "audit_endpoints", None)
        try:
            report = audit_determinism(fn, runs=runs, variables=variables, endpoints=endpoints)
        except Exception as exc:  # noqa: BLE001 - the target's own failure, as one line
            where = innermost_user_frame(traceback.extract_tb(exc.__traceback__))
            raise UsageError(f"MODULE:FN: auditing {target} failed: {type(exc).__name__}: {exc}"
                             + (f" (at {where})" if where else "")) from None
    print(report)
    write_reports(report, json_path, html_path)
    return EXIT_OK if report.passed else EXIT_DIFFERENT


def run(args) -> int:
    return audit_main(args.target, args.runs, json_path=args.json, html_path=args.html)


def add_parser(subparsers) -> None:
    audit = subparsers.add_parser("audit", help="is MODULE:FN bitwise reproducible?")
    audit.add_argument("target", metavar="MODULE:FN")
    audit.add_argument("--runs", type=int, default=3)
    audit.add_argument("--html", default=None)
    audit.add_argument("--json", default=None)
    audit.set_defaults(run=run)
