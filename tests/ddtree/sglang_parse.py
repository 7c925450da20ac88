"""Run sglang's own server-argument parser on argument lists (a subprocess of
test_ddtree_args.py, with PYTHONPATH = a patched sglang 0.5.23 tree + patches/ddtree).

stdin: JSON list of argv lists. stdout: JSON list of records: "rc" is argparse's exit code (0 when
parsed) with its "stderr"; "algorithm_error" what SpeculativeAlgorithm.from_string raises;
"resolved" what sglang's own _handle_dflash (patch 0015 inside) derived, or its error; "ddtree"
what sglang_ddtree.config.resolve gives for the parsed arguments, or its DDTreeArgError message.
"""

import contextlib
import io
import json
import sys

from sglang.srt.server_args import prepare_server_args
from sglang_ddtree.config import DDTreeArgError, resolve_from_server_args

out = []
for argv in json.load(sys.stdin):
    err = io.StringIO()
    rec = {"rc": 0, "stderr": "", "ddtree": None}
    try:
        with contextlib.redirect_stderr(err):
            args = prepare_server_args(argv)
    except SystemExit as e:
        rec["rc"] = int(e.code or 0)
    rec["stderr"] = err.getvalue()[-2000:]
    if rec["rc"] == 0 and args.speculative_algorithm is not None:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        try:
            SpeculativeAlgorithm.from_string(args.speculative_algorithm)
        except Exception as e:  # what sglang's resolution raises at startup
            rec["algorithm_error"] = f"{type(e).__name__}: {e}"
    if rec["rc"] == 0 and (args.speculative_algorithm or "").upper() == "DFLASH" and not rec.get("algorithm_error"):
        # sglang's own DFLASH resolution (patch 0015 inside): the derived verify width, or its error
        from sglang.srt.arg_groups import speculative_hook
        from sglang.srt.arg_groups.overrides import resolving_view

        if args.device is None:
            args.device = "cuda"  # the fleets' device; resolution checks it, there is no GPU here
        try:
            speculative_hook._handle_dflash(args)
            view = resolving_view(args)
            rec["resolved"] = {"verify_width": view.speculative_verify_num_tokens,
                               "topk": view.speculative_ddtree_topk,
                               "block": view.speculative_num_draft_tokens}
        except Exception as e:
            rec["resolved"] = {"error": f"{type(e).__name__}: {e}"}
        else:
            from sglang.srt.arg_groups.overrides import max_speculative_num_draft_tokens

            # the largest per-step draft width sglang sizes buffers and KV reservations by
            rec["max_draft_width"] = max_speculative_num_draft_tokens(args)
    if rec["rc"] == 0 and getattr(args, "speculative_ddtree_budget", None) is not None:
        try:
            r = resolve_from_server_args(args)
            rec["ddtree"] = {"budget": r.budget, "topk": r.topk, "verify_width": r.verify_width}
        except DDTreeArgError as e:
            rec["ddtree"] = {"error": str(e)}
    out.append(rec)
print(json.dumps(out))
