"""DDTreeWorker: DFLASH's worker with a draft tree instead of a draft chain.

Prefill (and idle DP rounds) are DFLASH's own. One decode step for ``bs`` requests, block size
``B`` (the drafter's), budget ``n``, verify width ``W = n + 1``:

1. Draft: the DFlash drafter runs its block ``[root, mask x (B-1)]`` exactly as DFLASH does; its
   hidden states give a distribution per depth ``1..B-1``; the top-k per depth is taken from the
   raw logits in vocabulary slices and normalised by one logsumexp (no full log-softmax). With
   CUDA graphs this head runs inside the drafter's graph (``head.DraftTopKHead``, in place of
   DFLASH's greedy head, which DDTree never reads); eager forwards compute it after the forward.
2. Tree: ``tree_kernel.KernelTree`` runs the reference heap in one Triton launch (a program per
   request; widths up to 64), which also writes the tree's cells of the flat verify mask; the
   walk of step 4 replays as a CUDA graph per shape. Wider trees, and requests that ask for it
   (``ddtree_test_path: graphed``, the previous default), take ``tree_device.build``'s
   level-by-level tensor ops replayed as a CUDA graph (``tree_device.GraphedTree``).
   ``tree`` (numpy, on the host) is the reference the CPU tests hold the device code to; a request
   can ask for it or for the eager ops (``ddtree_test_path: host | eager``) to measure against.
3. Verify: one TARGET_VERIFY pass over ``bs x W`` tokens, positions ``prefix + depth``, a tree
   mask (each node sees the prefix, its ancestors and itself), KV written to the request's
   window ``[prefix, prefix + W)`` (the scheduler reserves ``max(B, W)`` per step because patch
   0015 declares ``W`` as the largest draft width). With CUDA graphs the target replays graphs
   captured at width ``W`` (patches 0012-0014).
4. Accept: the target's token at every node (argmax at T = 0, a draw from its adjusted
   distribution at T > 0), walked down the tree as tensor ops (``tree_device.accept``: the
   deepest node whose whole root path matches). No value goes to the host in steps 1-5: the KV
   plans' host bounds come from the scheduler's host lengths, or under the overlap scheduler with a
   backend that plans from device lengths (triton) from the KV each request reserved (``lens.py``).
5. Commit: the accepted path's KV slots move to the front of the window by permuting the
   request's ``req_to_token`` row (no KV is copied); the drafter's context features for the
   committed tokens are written to the draft KV like DFLASH's; the bonus token starts the next
   block. The result has DFLASH's layout (``[bs, B]`` tokens, commit lengths), so the scheduler,
   the metrics (``spec_verify_ct``, ``spec_accept_length``, ``/server_info``, Prometheus) and
   the detokenizer see DFLASH.

Scheduling: sglang's non-overlap scheduler (``--disable-overlap-schedule``), or the overlap scheduler opted into
with ``SGLANG_DDTREE_OVERLAP=1`` (config.OVERLAP_ENV): the scheduler then prepares the next batch while a step
runs, from the lengths the step publishes after its commit; the step's KV window lies inside the decode reserve
that covers a block of lag (patch 0016), and ``_fence_scheduler_writes`` keeps the scheduler's next writes behind
the step's own ``req_to_token`` commit. Built and tested on the CPU as far as it goes there; its first GPU runs are
bench/ddtree_real.py's overlap servers and tests/ddtree/prodseq.py --overlap.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import torch
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.lora.layers import unwrap_lora_layer
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
    enable_num_token_non_padded,
)
from sglang.srt.runtime_context import get_parallel
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.dflash_utils import apply_dflash_verify_logits_adjustments
from sglang.srt.speculative.dflash_worker_v2 import (
    DFlashWorkerV2,
    _resolve_dflash_embedding_module,
)
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_utils import draft_tp_context

from . import tree as tree_mod
from . import tree_device, tree_kernel
from .config import resolve_from_server_args
from .head import DraftTopKHead, draft_topk
from .lens import HostLens, host_lens, mask_cells, sync_forced
from .profile import StepProfiler

# The sampler (node_draws), its test faults (TEST_FAULTS, each documented there, read by read_test_fault at start)
# and _renorm live in sampling.py: plain torch, tested on CPU by tests/ddtree/test_ddtree_sampler.py. The names
# stay importable from here, where docs and tools look for them.
from .sampling import TEST_FAULTS, node_draws, read_test_fault  # noqa: F401
from .sampling import renorm as _renorm  # noqa: F401

logger = logging.getLogger(__name__)


class DDTreeWorker(DFlashWorkerV2):
    """DFLASH with tree drafting and tree verify (see the module docstring)."""

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self.ddtree = resolve_from_server_args(server_args)
        unsupported = {
            "a sliding-window draft cache (--speculative-draft-window-size)": self.use_compact_draft_cache,
            "a candidate-selector drafter": self.selector is not None,
            "a LiLiCorr drafter": self.lilicorr is not None,
            "a Domino drafter": bool(self._is_domino),
            "mamba / hybrid targets": bool(self._need_mamba_verify_commit),
        }
        bad = [name for name, on in unsupported.items() if on]
        if bad:
            raise ValueError(f"DDTree does not support {', '.join(bad)}")
        if int(self.block_size) != self.ddtree.block_size:
            raise ValueError(
                f"DDTree: the drafter's block size {self.block_size} differs from --speculative-num-draft-tokens "
                f"{self.ddtree.block_size}"
            )
        self.verify_width = self.ddtree.verify_width
        self.topk = self.ddtree.topk
        self._test_fault = read_test_fault()
        if self._test_fault:
            logger.warning("DDTree: TEST FAULT %s is on; this server samples wrongly on purpose", self._test_fault)
        # the step's KV window covers both the draft block and the verify width (reserved per step
        # by the scheduler: patch 0015 declares max(block, budget + 1) as the draft width)
        self.window_width = max(self.verify_width, int(self.block_size))
        _check_decode_reserve(int(self.block_size), self.window_width)
        self._depth_offsets = torch.arange(self.window_width, dtype=torch.int64, device=self.device)
        self._block_offsets = torch.arange(int(self.block_size), dtype=torch.int64, device=self.device)
        # the device tree's ops replayed as CUDA graphs (tree_device.GraphedTree); off: SGLANG_DDTREE_TREE_GRAPHS=0
        self._graphed_tree = (tree_device.GraphedTree(self.ddtree.budget, int(self.block_size))
                              if os.environ.get("SGLANG_DDTREE_TREE_GRAPHS", "1") != "0" else None)
        # the tree in one Triton launch (tree_kernel); wider trees keep the graphed tensor ops
        self._kernel_tree = (tree_kernel.KernelTree(self.ddtree.budget, int(self.block_size))
                             if tree_kernel.KernelTree.supports(self.ddtree.budget) else None)
        if self._kernel_tree is not None:
            problem = tree_kernel.self_check(self.ddtree.budget, int(self.block_size), self.topk, self.device)
            if problem is not None:  # loud, not fatal: the graphed tensor ops build the same tree
                logger.error("DDTree tree kernel not used (%s); the graphed tensor ops build the tree", problem)
                self._kernel_tree = None
        # sglang's overlap scheduler (opted into with SGLANG_DDTREE_OVERLAP=1, config.OVERLAP_ENV): the scheduler
        # prepares the next batch while this step runs; _fence_scheduler_writes keeps its writes behind the step
        self._overlap = not bool(getattr(server_args, "disable_overlap_schedule", False))
        self._head_rows = 0  # > 0: this step's candidates are in the draft graph's head buffers
        self._prof = StepProfiler.from_env()  # per-stage timing for bench/ddtree_step.py, off by default
        # SGLANG_DDTREE_SYNC_LENS=1: copy the device lengths to the host every step (waits for the step before),
        # the behaviour before lens.py's reserved bound, kept to measure against (bench/ddtree_real.py)
        self._sync_lens = sync_forced()
        logger.info(
            "DDTree on: budget=%d topk=%d block=%d verify width=%d scheduler=%s tree=%s",
            self.ddtree.budget,
            self.topk,
            self.block_size,
            self.verify_width,
            "overlap" if self._overlap else "non-overlap",
            # which build a default request's tree takes: an operator reads it in the log (kernel: one Triton launch)
            "kernel" if self._kernel_tree is not None else
            "graphed" if self._graphed_tree is not None else "tensor ops",
        )

    # ------------------------------------------------------------------ entry
    def forward_batch_generation(
        self, batch: ScheduleBatch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None
    ) -> GenerationBatchResult:
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle():
            return super().forward_batch_generation(
                batch, on_publish=on_publish, grammar_barrier=grammar_barrier, pp_proxy_tensors=pp_proxy_tensors
            )
        if batch.has_grammar:
            raise RuntimeError("DDTree does not support grammar-constrained requests in this build")
        if batch.spec_info is None:
            batch.spec_info = DFlashDraftInputV2.create_idle_input(device=self.device)
        if not isinstance(batch.spec_info, DFlashDraftInputV2):
            raise RuntimeError("DDTree expected DFlashDraftInputV2 state on the running batch")
        return self._decode_step(batch, on_publish)

    # ------------------------------------------------------------------ draft
    def _maybe_build_draft_sampler(self):
        """The draft graph's tail: DDTree's top-k head (``head.DraftTopKHead``) in place of DFLASH's
        greedy argmax, which DDTree never reads. ``None`` keeps the head eager (``_tree_candidates``):
        TP > 1 (the vocabulary-parallel head gathers across ranks), a head without a dense bf16 /
        fp16 / fp32 weight or with added vocabulary, or ``SGLANG_DDTREE_GRAPH_HEAD=0``."""
        from sglang.srt.runtime_context import get_exec

        lm_head = unwrap_lora_layer(getattr(self.target_worker.model_runner.model, "lm_head", None))
        weight = getattr(lm_head, "weight", None)
        shard = getattr(lm_head, "shard_indices", None)
        vocab = int(self.model_runner.model_config.vocab_size)
        reason = None
        if os.environ.get("SGLANG_DDTREE_GRAPH_HEAD", "1") == "0":
            reason = "SGLANG_DDTREE_GRAPH_HEAD=0"
        elif get_parallel().tp_size > 1:
            reason = "tp > 1"
        elif weight is None or weight.dim() != 2 or weight.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            reason = "no dense head weight"
        elif (shard is not None and int(shard.num_added_elements) != 0) or int(weight.shape[0]) < vocab:
            reason = "added or missing vocabulary rows"
        if reason is not None:
            logger.info("DDTree draft top-k head kept eager (%s)", reason)
            return None
        logger.info("DDTree draft top-k head (k=%d) folded into the draft CUDA graph", self.topk)
        return DraftTopKHead(weight=weight, vocab=vocab, block_size=int(self.block_size), k=self.topk,
                             max_bs=max(get_exec().graph.cuda_graph_config.decode.bs))

    def _window_locs(self, batch: ScheduleBatch, prefix_lens: torch.Tensor, width: int) -> torch.Tensor:
        """[bs, width] virtual KV slots of the request windows ``[prefix, prefix + width)``."""
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        cols = prefix_lens.to(torch.int64).unsqueeze(1) + self._depth_offsets[:width].unsqueeze(0)
        rows = batch.req_pool_indices.to(torch.int64).unsqueeze(1).expand_as(cols)
        return req_to_token[rows, cols].to(torch.int64)

    def _window_plan(self, batch: ScheduleBatch, prefix_lens: torch.Tensor, lens: HostLens,
                     locs: torch.Tensor, width: int):
        """The KV plan of a forward writing ``width`` slots per request at ``locs`` (flattened
        ``[bs, width]``), with the host bound ``lens.bound(width)`` (DFLASH's prefix + width, or the
        reservation that covers it); returns (plan, host bound)."""
        seq_lens_cpu = lens.bound(width)
        plan = self.target_worker.model_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            seq_lens_cpu=seq_lens_cpu,
            write_virtual=locs,
            read_extent=width,
        )
        return plan, seq_lens_cpu

    def _draft_block(self, batch: ScheduleBatch, prefix_lens: torch.Tensor, lens: HostLens,
                     window: torch.Tensor, use_graph_head: bool = True):
        """Run the DFlash drafter on ``[root, mask...]``; return its hidden states [bs, B, H].
        ``use_graph_head``: this step reads the candidates the draft graph's head wrote (path device)."""
        draft_input = batch.spec_info
        bs = int(prefix_lens.shape[0])
        block = int(self.block_size)
        device = self.device
        block_ids = torch.full((bs, block), int(self._mask_token_id), dtype=torch.long, device=device)
        block_ids[:, 0].copy_(draft_input.bonus_tokens.view(-1))
        positions = (prefix_lens.to(torch.int64).unsqueeze(1) + self._block_offsets.unsqueeze(0)).reshape(-1)
        block_locs = window[:, :block].reshape(-1).contiguous()

        target_model = self.target_worker.model_runner.model
        embed_module = unwrap_lora_layer(_resolve_dflash_embedding_module(self.draft_model, target_model))
        if self._full_embed_gpu is not None:
            noise = torch.nn.functional.embedding(block_ids, self._full_embed_gpu)
        else:
            noise = embed_module(block_ids)
        if self._noise_embed_scale != 1.0:
            noise = noise * self._noise_embed_scale
        input_embeds = noise.view(-1, noise.shape[-1])

        plan, seq_lens_cpu = self._window_plan(batch, prefix_lens, lens, block_locs, block)
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            out_cache_loc=block_locs,
            seq_lens_sum=int(seq_lens_cpu.sum()),
            seq_lens_cpu=seq_lens_cpu,
            positions=positions,
            input_embeds=input_embeds,
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=self._draft_block_spec_info,
            capture_hidden_mode=CaptureHiddenMode.NULL,
            num_token_non_padded=(
                torch.full((), bs * block, dtype=torch.int32, device=device) if enable_num_token_non_padded() else None
            ),
            global_num_token_non_padded_cpu=bs * block,
            can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph,
        )
        plan.bind(forward_batch, self.draft_model_runner.kv_index_translator)
        if self._prof is not None:
            self._prof.mark("draft_prep")
        with torch.inference_mode(), draft_tp_context(self.draft_parallel_layout):
            out = self.draft_model_runner.forward(forward_batch)
        # the graph's head wrote this step's candidates (read by _tree_candidates)
        graph_head = isinstance(self._draft_sampler, DraftTopKHead) and bool(getattr(out, "can_run_graph", False))
        self._head_rows = bs if graph_head and use_graph_head else 0
        hidden = out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTree: the DFlash drafter returned no hidden states")
        return hidden.view(bs, block, -1)

    def _tree_candidates(self, batch: ScheduleBatch, draft_hidden: torch.Tensor):
        """Top-k log-probabilities and token ids per depth, ``[bs, B-1, K]`` each (on the GPU).
        Tests hook this method to replace the drafter's proposals (tests/ddtree/oracle)."""
        bs, block = int(draft_hidden.shape[0]), int(draft_hidden.shape[1])
        if self._head_rows:  # computed inside the draft graph (head.DraftTopKHead)
            return self._draft_sampler.read(self._head_rows)
        lm_head = unwrap_lora_layer(getattr(self.target_worker.model_runner.model, "lm_head", None))
        if lm_head is None or not hasattr(lm_head, "weight"):
            raise RuntimeError("DDTree needs the target's lm_head weight for the draft distributions")
        vocab = int(self.model_runner.model_config.vocab_size)
        if get_parallel().tp_size == 1:
            logp, ids = draft_topk(draft_hidden.reshape(-1, draft_hidden.shape[-1]), lm_head.weight, vocab, block,
                                   self.topk)
            return logp.view(bs, block - 1, -1), ids.view(bs, block - 1, -1)
        # vocab-parallel head: local top-k, gather, top-k again (exact: the global top-k is
        # contained in the union of the local ones); normalise with a gathered logsumexp.
        from sglang.srt.distributed import tensor_model_parallel_all_gather

        h = draft_hidden[:, 1:, :].reshape(-1, draft_hidden.shape[-1])
        logits = torch.matmul(h, lm_head.weight.t())
        shard = getattr(lm_head, "shard_indices", None)
        start = int(shard.org_vocab_start_index) if shard is not None else 0
        n_org = int(shard.num_org_elements) if shard is not None else logits.shape[1]
        logits = logits[:, :n_org].float()
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        vals, ids = torch.topk(logits, min(self.topk, logits.shape[1]), dim=-1)
        all_vals = tensor_model_parallel_all_gather(vals.contiguous(), dim=-1)
        all_ids = tensor_model_parallel_all_gather((ids + start).contiguous(), dim=-1)
        all_lse = tensor_model_parallel_all_gather(lse.contiguous(), dim=-1)
        total = torch.logsumexp(all_lse, dim=-1, keepdim=True)
        top_vals, pos = torch.topk(all_vals, self.topk, dim=-1)
        top_ids = torch.gather(all_ids, 1, pos)
        logp = top_vals - total
        return logp.view(bs, block - 1, -1), top_ids.view(bs, block - 1, -1)

    # ------------------------------------------------------------------ target
    def _target_tokens(self, logits: torch.Tensor, sampling_info, positions: torch.Tensor) -> torch.Tensor:
        """The target's token at every node: argmax for greedy rows, a draw from the adjusted
        distribution (temperature, top-k, top-p, min-p) otherwise (``sampling.node_draws``)."""
        if sampling_info is None or sampling_info.is_all_greedy:
            return torch.argmax(logits, dim=-1)
        seeds = sampling_info.sampling_seed
        seeded_draw = None
        if seeds is not None:
            from sglang.srt.layers.sampler import multinomial_with_seed as seeded_draw
        return node_draws(
            logits, sampling_info.temperatures, sampling_info.top_ks, sampling_info.top_ps, sampling_info.min_ps,
            self.verify_width, seeds=seeds, positions=positions, fault=self._test_fault, seeded_draw=seeded_draw,
        )

    # ------------------------------------------------------------------ step
    def _decode_step(self, batch: ScheduleBatch, on_publish) -> GenerationBatchResult:
        draft_input = batch.spec_info
        bs = len(batch.seq_lens)
        device = self.device
        block = int(self.block_size)
        w = self.verify_width
        prefix_lens = batch.seq_lens
        topk = self._request_topk(batch)
        path = self._request_path(batch)
        host_path = path == "host"
        # device: the graph's top-k head and the one-launch tree; graphed: the previous default
        # (head after the forward, the tree's tensor ops as a CUDA graph); eager / host: references
        kernel = self._kernel_tree if path == "device" else None
        graphed = self._graphed_tree if path in ("device", "graphed") and kernel is None else None
        prof = self._prof
        if prof is not None:
            kind = "kernel" if kernel is not None else "graphed" if graphed is not None else \
                "host" if host_path else "eager"
            prof.begin(f"{kind}/k{topk}/bs{bs}{self._profile_tag(batch)}")
        window = self._window_locs(batch, prefix_lens, self.window_width)  # [bs, max(W, B)]

        # the host's lengths (lens.py): the scheduler's copy when it has one; under the overlap scheduler with a
        # backend that plans from device lengths (triton) the KV each request reserved, which bounds the window
        # without waiting for the step before; the device lengths copied over (a wait) only for the host path
        lens = host_lens(seq_lens_cpu=batch.seq_lens_cpu, reserved=getattr(draft_input, "nxt_kv_lens_cpu", None),
                         device_lens=prefix_lens, window=self.window_width, need_exact=host_path,
                         sync=self._sync_lens)
        if prof is not None:  # the draft stage in three (profiling only): the lengths, the launch's prep, the forward
            prof.mark("lens")
        # 1) draft distributions
        draft_hidden = self._draft_block(batch, prefix_lens, lens, window, use_graph_head=path == "device")
        if prof is not None:
            prof.mark("draft")
        logp, ids = self._tree_candidates(batch, draft_hidden)
        if prof is not None:
            prof.mark("topk")
        # host bound = committed prefix + the verify window (DFLASH's convention); the mask is
        # padded to the size the backends check against that bound (cells past the last block
        # are never read)
        verify_locs = window[:, :w].reshape(-1).contiguous()
        plan, seq_lens_cpu = self._window_plan(batch, prefix_lens, lens, verify_locs, w)
        cells = mask_cells(lens, w, limit=self._mask_limit())
        # 2) tree: on the device by default (tree_device), on the host for comparison (tree)
        if host_path:
            roots = draft_input.bonus_tokens.view(-1).to("cpu", torch.int64).numpy()
            tree = tree_mod.build_batch(roots, logp.float().cpu().numpy(), ids.cpu().numpy(), self.ddtree.budget,
                                        topk=topk)
            tokens = torch.from_numpy(tree.tokens).to(device, non_blocking=True).reshape(-1)
            depths = torch.from_numpy(tree.depths).to(device)
            if prof is not None:
                prof.mark("tree")
            assert lens.prefix is not None  # host_lens gives the host path the exact lengths
            mask = self._tree_mask(tree, lens.prefix, pad_to=cells).to(device, non_blocking=True)
        else:
            roots = draft_input.bonus_tokens.view(-1)
            mask = None
            if kernel is not None:  # the kernel writes the tree's cells of the flat mask in the same launch
                mask = torch.ones(cells, dtype=torch.bool, device=device)
                dtree = kernel.build(roots, logp, ids, topk, prefix_lens=prefix_lens, flat=mask)
            elif graphed is not None:
                dtree = graphed.build(roots, logp, ids, topk)
            else:
                dtree = tree_device.build(roots, logp, ids, self.ddtree.budget, topk=topk)
            tokens = dtree.tokens.reshape(-1)
            depths = dtree.depths
            if prof is not None:
                prof.mark("tree")
            if mask is None:
                mask = tree_device.flat_mask(dtree.ancestors, prefix_lens, cells)
        if prof is not None:
            prof.mark("mask")

        # 3) target verify over the tree
        positions = (prefix_lens.to(torch.int64).unsqueeze(1) + depths).reshape(-1)
        verify_input = DFlashVerifyInput(
            draft_token=tokens,
            positions=positions,
            draft_token_num=w,
            custom_mask=mask,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            kv_loc_plan=plan,
        )
        batch.out_cache_loc = verify_locs
        saved_cpu, saved_sum = batch.seq_lens_cpu, batch.seq_lens_sum
        batch.seq_lens_cpu = seq_lens_cpu
        batch.seq_lens_sum = int(seq_lens_cpu.sum())
        verify_batch, _ = verify_input.prepare_for_verify(batch, self.target_worker)
        batch.seq_lens_cpu, batch.seq_lens_sum = saved_cpu, saved_sum
        if prof is not None:
            prof.mark("prepare")
        target_out = self.target_worker.forward_batch_generation(
            batch=None, forward_batch=verify_batch, is_verify=True, skip_attn_backend_init=True
        )
        logits_output = target_out.logits_output
        target_lp = self._target_logits_processor
        if target_lp is not None and target_lp.is_deferred_shard(logits_output.next_token_logits):
            logits_output.next_token_logits = target_lp.finish_deferred_gather(logits_output.next_token_logits)
        logits = logits_output.next_token_logits
        sampling_info = batch.sampling_info
        if sampling_info is not None:
            apply_dflash_verify_logits_adjustments(
                next_token_logits=logits, sampling_info=sampling_info, draft_token_num=w
            )
        if prof is not None:
            prof.mark("verify")

        # 4) accept: the target's token at every node, walked down the tree
        target_tokens = self._target_tokens(logits, sampling_info, positions)
        if host_path:
            acc = tree_mod.accept(tree, target_tokens.view(bs, w).cpu().numpy(), block)
            perm = torch.from_numpy(tree_mod.window_permutation(acc, w)).to(device)
            commit_lens = torch.from_numpy(acc.commit_lens.astype(np.int32)).to(device)
            out_tokens = torch.from_numpy(acc.out_tokens).to(device)
            bonus = torch.from_numpy(acc.bonus).to(device)
            paths = torch.from_numpy(acc.paths).to(device)  # [bs, B] slots in the old window order
        else:
            if kernel is not None:
                dacc = kernel.accept(dtree, target_tokens.view(bs, w))
            elif graphed is not None:
                dacc = graphed.accept(dtree, target_tokens.view(bs, w))
            else:
                dacc = tree_device.accept(dtree, target_tokens.view(bs, w), block)
            perm = dacc.permutation
            commit_lens = dacc.commit_lens.to(torch.int32)
            out_tokens, bonus, paths = dacc.out_tokens, dacc.bonus, dacc.paths
        if prof is not None:
            prof.mark("accept")

        # 5) commit: accepted path to the front of each window (req_to_token permutation)
        new_window = window.clone()
        new_window[:, :w] = torch.gather(window[:, :w], 1, perm)
        req_to_token = self.model_runner.req_to_token_pool.req_to_token
        cols = prefix_lens.to(torch.int64).unsqueeze(1) + self._depth_offsets[:w].unsqueeze(0)
        rows = batch.req_pool_indices.to(torch.int64).unsqueeze(1).expand_as(cols)
        req_to_token[rows, cols] = new_window[:, :w].to(req_to_token.dtype)
        row_index = (torch.arange(bs, device=device).unsqueeze(1) * w + paths).reshape(-1)

        if batch.return_logprob:
            chain = logits_output.next_token_logits[row_index]
            logits_output.next_token_logits = chain
            compute_spec_logprobs(batch, logits_output, out_tokens.reshape(-1), chain_stride=block)
        else:
            logits_output.next_token_logits = None

        new_seq_lens = prefix_lens + commit_lens.to(prefix_lens.dtype)
        if on_publish is not None:
            on_publish(new_seq_lens)
        if prof is not None:
            prof.mark("commit")

        # drafter context features of the committed tokens, DFLASH's writer
        hidden = logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTree verify needs the target's hidden states (capture FULL)")
        hidden = hidden[: bs * w][row_index]  # [bs * B, Hc], the accepted path in order
        draft_locs = new_window[:, :block].contiguous()
        draft_plan, _ = self._window_plan(batch, prefix_lens, lens, draft_locs.reshape(-1), block)
        cache_loc = self._draft_write_ids(draft_plan)
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=hidden,
            cache_loc=cache_loc,
            cache_loc_2d=cache_loc.view(bs, block),
            positions=(prefix_lens.to(torch.int64).unsqueeze(1) + self._block_offsets.unsqueeze(0)).reshape(-1),
            commit_lens=commit_lens,
        )
        logits_output.hidden_states = None
        if prof is not None:
            prof.mark("draft_kv")

        next_draft_input = self._make_next_draft_input_decode(bonus_tokens=bonus, new_seq_lens=new_seq_lens)
        if self._overlap:
            self._fence_scheduler_writes()
        if prof is not None:
            prof.end()
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=out_tokens.reshape(-1),
            accept_lens=commit_lens,
            can_run_cuda_graph=target_out.can_run_cuda_graph,
            next_draft_input=next_draft_input,
            speculative_num_draft_tokens=block,
            new_seq_lens=new_seq_lens,
            routed_experts_output=target_out.routed_experts_output,
            indexer_topk_output=target_out.indexer_topk_output,
        )

    def _mask_limit(self) -> int | None:
        """Cells of the target's captured verify-mask buffer (graph replays copy the flat mask into it), None
        where the backend keeps none."""
        vm = getattr(self.target_worker.model_runner.attn_backend, "verify_mask", None)
        buf = getattr(vm, "buffer", None)
        return None if buf is None else int(buf.numel())

    def _fence_scheduler_writes(self) -> None:
        """Under the overlap scheduler, hand the scheduler's write-after-read barrier an event recorded after the
        whole step. The scheduler fences its next writes on the schedule stream (the next batch's slot allocation
        in ``req_to_token``, a freed request row given to a new request, the slots it frees read from that row)
        behind the event of the step's last shared read, which for DFLASH is where the target verify's reads end.
        This step reads and rewrites ``req_to_token`` after the verify (the commit's permutation of each window),
        so a row freed for a request that finished a step earlier could otherwise be reassigned and written while
        this step still permutes it. The host is not held: the wait is on the GPU stream, and the scheduler's host
        work (results, the next batch) still overlaps this step."""
        done = torch.cuda.Event()
        done.record()
        runner = getattr(self, "last_shared_read_runner", None) or self.target_worker.model_runner
        runner.shared_read_done_event = done

    def _request_path(self, batch: ScheduleBatch) -> str:
        """``device`` (the default: the top-k head inside the draft graph, the tree in one Triton
        launch, mask and walk as tensor ops, the walk replayed as a CUDA graph), ``graphed`` (the
        previous default: the head after the draft forward, the tree's tensor ops replayed as a CUDA
        graph), ``eager`` (those ops launched one by one) or ``host`` (the numpy reference in
        ``tree``), the last three kept to measure against; tests and bench/ddtree_step.py choose per batch through
        ``ddtree_test_path`` in a request's custom_params."""
        wanted = {
            str((getattr(r.sampling_params, "custom_params", None) or {}).get("ddtree_test_path", "device"))
            for r in batch.reqs
        }
        if not wanted <= {"device", "graphed", "eager", "host"} or len(wanted) > 1:
            raise ValueError(
                f"ddtree_test_path must be one of device, graphed, eager, host per batch, got {sorted(wanted)}")
        return wanted.pop() if wanted else "device"

    @staticmethod
    def _profile_tag(batch: ScheduleBatch) -> str:
        for r in batch.reqs:
            tag = (getattr(r.sampling_params, "custom_params", None) or {}).get("ddtree_profile_tag")
            if tag:
                return f"/{tag}"
        return ""

    def _request_topk(self, batch: ScheduleBatch) -> int:
        """The server's top-k; tests narrow it per batch through ``ddtree_test_topk`` in a
        request's custom_params (all requests of a batch must agree)."""
        wanted = set()
        for req in batch.reqs:
            cp = getattr(req.sampling_params, "custom_params", None) or {}
            if "ddtree_test_topk" in cp:
                wanted.add(int(cp["ddtree_test_topk"]))
        if not wanted:
            return self.topk
        if len(wanted) > 1 or min(wanted) < 1 or max(wanted) > self.topk:
            raise ValueError(f"ddtree_test_topk must be one value in 1..{self.topk} per batch, got {sorted(wanted)}")
        return wanted.pop()

    def _tree_mask(self, tree: tree_mod.TreeBatch, prefix_cpu: torch.Tensor, pad_to: int = 0) -> torch.Tensor:
        """Flattened per-request ``W x (prefix + W)`` allow-masks, request after request."""
        return torch.from_numpy(tree_mod.flat_mask(tree, prefix_cpu.numpy(), pad_to=pad_to))


def _check_decode_reserve(block: int, window: int) -> None:
    """Refuse to start on an sglang whose DFLASH v2 decode reserve cannot hold the verify window
    (patch 0016): without it a window wider than 2 x block writes into KV slots the request does
    not own, which corrupts output silently."""
    from sglang.srt.speculative import dflash_info_v2

    reserve = getattr(dflash_info_v2, "dflash_decode_reserve", None)
    if reserve is None or reserve(block, window) < window + block:
        raise RuntimeError(
            f"DDTree needs sglang's DFLASH decode KV reserve to cover a verify window of {window} slots "
            "past a block of lag (patch 0016-dflash-v2-decode-reserve-covers-verify-width of this repo's "
            "series); this sglang build lacks it"
        )
