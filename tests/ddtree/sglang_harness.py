"""Harness that runs the REAL sglang 0.5.23 Triton attention backend outside a server.

What is real: sglang's `TritonAttnBackend` (construction, `init_forward_metadata`,
`init_cuda_graph_state`, `init_forward_metadata_out_graph` for capture and replay,
`forward_extend`), its Triton extend-attention kernel, `ReqToTokenPool`,
`MHATokenToKVPool`, `KVIndexTranslator`, `RadixAttention`, `ForwardBatch` /
`ForwardMode`, `DFlashVerifyInput`, `resolve_dflash_verify_mask_policy`, and the
runtime config bags (`_ConfigBag`) filled from `ServerArgs` field defaults.

What is the harness: the config bags are projected from an *unresolved* `ServerArgs`
(the resolution pipeline needs a model checkpoint and a draft model), and
`ModelRunnerLike` carries only the attributes the backend reads from a ModelRunner.
During the *import* of sglang, `torch.cuda.is_available` reports False so that the
module-level `if _is_cuda: import sgl_kernel` branches (sgl_kernel 0.4.10 is built for
torch 2.14.1 and cannot load on the H200's torch 2.11) are not taken; afterwards the
extend-attention kernel module's platform constants are restored to the real GPU
(`_is_cuda`, `CUDA_CAPABILITY`) so the kernel picks its real sm_90 tile config.
Consequence: the backend runs with `use_pdl=False` (launch attribute only).

FlashInfer variant (`import_flashinfer_backend`): sglang's `FlashInferAttnBackend`
(construction, `init_forward_metadata`, `init_cuda_graph_state`,
`init_forward_metadata_out_graph` for capture and replay, `forward_extend`) with the
real FlashInfer 0.7.2 wrappers and JIT-compiled kernels. The harness only binds the
FlashInfer names the module would have imported had CUDA been visible at import.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass


def sglang_path() -> str | None:
    return os.environ.get("DDTREE_SGLANG_PATH")


# DDTREE_MUTANT=seeds: DDTREE_SGLANG_PATH holds the patched series + the mutant
# tests/ddtree/mutants/seeds-block-size-indexing.patch (the seeds' bug put back into
# the patched Triton backend). Checked at import so a mislabelled run cannot pass.
MUTANTS = {"seeds": ("sglang/srt/layers/attention/triton_backend.py", "MUTANT seeds")}


def mutant() -> str | None:
    return os.environ.get("DDTREE_MUTANT") or None


def check_mutant_applied(root: str) -> None:
    m = mutant()
    if m is None:
        return
    if m not in MUTANTS:
        raise RuntimeError(f"DDTREE_MUTANT={m!r}: unknown mutant (known: {sorted(MUTANTS)})")
    rel, marker = MUTANTS[m]
    with open(os.path.join(root, rel)) as f:
        carried = marker in f.read()
    if not carried:
        raise RuntimeError(f"DDTREE_MUTANT={m} but {root}/{rel} does not carry the mutant: apply "
                           f"tests/ddtree/mutants/seeds-block-size-indexing.patch (patch -p1) first")


@contextlib.contextmanager
def _no_cuda_during_import():
    import torch

    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: False
    try:
        yield
    finally:
        torch.cuda.is_available = real


def import_sglang():
    """Import the modules under test from DDTREE_SGLANG_PATH (patched or not)."""
    path = sglang_path()
    if path and path not in sys.path:
        sys.path.insert(0, path)
    import torch

    with _no_cuda_during_import():
        # Imported lazily by the code under test (graph capture, mask policy):
        # import them here too, under the same import-time platform view.
        import sglang.srt.layers.attention.hybrid_attn_backend
        import sglang.srt.layers.attention.tbo_backend
        import sglang.srt.layers.attention.triton_backend as tb
        import sglang.srt.layers.radix_attention
        import sglang.srt.mem_cache.kv_index_translator
        import sglang.srt.mem_cache.memory_pool
        import sglang.srt.model_executor.forward_batch_info
        import sglang.srt.speculative.dflash_info
        import sglang.srt.speculative.dflash_utils
        from sglang.kernels.ops.attention import extend_attention as ea
    check_mutant_applied(os.path.dirname(os.path.dirname(sglang.__file__)))
    # Restore the real platform for the kernel's tile selection.
    if torch.cuda.is_available():
        ea._is_cuda = True
        ea.CUDA_CAPABILITY = torch.cuda.get_device_capability()
        from sglang.srt.utils import common

        for fn in ("is_cuda", "is_cuda_alike"):
            f = getattr(common, fn, None)
            if f is not None and hasattr(f, "cache_clear"):
                f.cache_clear()
    return tb


_FLASHINFER_NAMES = ("BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
                     "BatchPrefillWithRaggedKVCacheWrapper", "fast_decode_plan")


def import_flashinfer_backend():
    """Import sglang's FlashInfer backend (after import_sglang) under the same
    import-time platform view, then bind the real FlashInfer wrappers into it:
    the module imports them only `if is_flashinfer_available()`, which is False
    while CUDA is hidden. FlashInfer itself is imported with the real GPU view;
    its kernels are JIT-compiled on first use (FLASHINFER_CUDA_ARCH_LIST)."""
    import_sglang()
    with _no_cuda_during_import():
        import sglang.srt.layers.attention.flashinfer_backend as fb
    import flashinfer
    from flashinfer.cascade import merge_state

    for name in _FLASHINFER_NAMES:
        if not hasattr(fb, name):
            setattr(fb, name, getattr(flashinfer, name))
    if not hasattr(fb, "merge_state"):
        fb.merge_state = merge_state
    return fb


def install_config(*, block: int, verify_q: int | None, topk: int, context_len: int,
                   model_path: str, set_verify_arg: bool, attention_backend: str = "triton"):
    """Project ServerArgs field defaults (plus our spec values) into the real
    runtime config bags and install them in the process context."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.arg_groups.arg_utils import namespace_of
    from sglang.srt.server_args import ServerArgs

    kw = dict(
        model_path=model_path,
        speculative_algorithm="DFLASH",
        speculative_num_draft_tokens=block,
        speculative_num_steps=block - 1,
        speculative_eagle_topk=topk,
        attention_backend=attention_backend,
        context_length=context_len,
        skip_tokenizer_init=True,
        device="cuda",
        triton_attention_num_kv_splits=8,
    )
    fields = namespace_of(ServerArgs)
    has_verify_arg = "speculative_verify_num_tokens" in fields
    if set_verify_arg and has_verify_arg and verify_q is not None:
        kw["speculative_verify_num_tokens"] = verify_q
    sa = ServerArgs(**kw)
    tops: dict = {}
    for field, path in fields.items():
        parts = path.split(".")
        bag = tops.get(parts[0])
        if bag is None:
            bag = tops[parts[0]] = rc._ConfigBag(parts[0])
        for depth in range(1, len(parts)):
            name = parts[depth]
            subs = object.__getattribute__(bag, "_subs")
            child = subs.get(name)
            if child is None:
                child = rc._ConfigBag(".".join(parts[: depth + 1]))
                bag._set_sub(name, child)
            bag = child
        bag._set(field, getattr(sa, field, None))
    ctx = rc.get_context()
    ctx._server_args = sa
    ctx._config_bags = tops
    tops["device"]._set("gpu_id", 0)
    tops["spec"]._set("max_speculative_num_draft_tokens", max(block, verify_q or 0))
    ctx.parallel._config = tops.get("parallel")
    # Single-GPU widths (a real server derives them at publish; groups are left
    # unset). FlashInfer's setup also reads attn_dp_enabled (cuda-graph bs alignment).
    for k, v in dict(tp_size=1, attn_tp_size=1, attn_dcp_size=1, attn_dcp_rank=0,
                     attn_cp_size=1, attn_tp_rank=0, attn_dp_enabled=False, dcp_enabled=False,
                     attn_dp_rank=0, attn_cp_rank=0, dp_rank=0, tp_rank=0, num_dp_ranks=1,
                     moe_ep_size=1, moe_tp_size=1, moe_dp_rank=0, moe_ep_rank=0, moe_tp_rank=0,
                     pp_rank=0, launch_world_size=1, launch_world_rank=0, max_world_size=1).items():
        with contextlib.suppress(Exception):
            ctx.parallel.override_permanently(**{k: v})
    return sa, has_verify_arg


@dataclass
class ModelConfigLike:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    context_len: int
    hf_config: object = None

    def __post_init__(self):
        from sglang.srt.configs.model_config import AttentionArch
        from transformers import LlamaConfig

        self.attention_arch = AttentionArch.MHA
        if self.hf_config is None:
            self.hf_config = LlamaConfig(
                hidden_size=self.num_heads * self.head_dim, num_attention_heads=self.num_heads,
                num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim,
                num_hidden_layers=1, vocab_size=1000, max_position_embeddings=self.context_len,
            )
        if not getattr(self.hf_config, "architectures", None):
            self.hf_config.architectures = ["LlamaForCausalLM"]  # FlashInfer reads it
        self.num_attention_heads = self.num_heads
        self.is_multimodal = False
        self.v_head_dim = self.head_dim
        self.swa_v_head_dim = self.head_dim
        self.is_encoder_decoder = False
        self.linear_attn_registry_result = None
        self.qk_nope_head_dim = self.qk_rope_head_dim = self.kv_lora_rank = 0

    def get_max_num_attention_heads(self):
        return self.num_heads

    def get_num_kv_heads(self, tp_size, dcp_size=1):
        return self.num_kv_heads


class ModelRunnerLike:
    """The attributes TritonAttnBackend.__init__ reads from a ModelRunner, holding
    real sglang pools and translator."""

    def __init__(self, *, max_bs, context_len, num_heads, num_kv_heads, head_dim,
                 kv_size, dtype, device="cuda", server_args=None, attention_backend="triton"):
        import torch
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.device = device
        self.gpu_id = 0
        # Read by FlashInferAttnBackend.__init__ (TritonAttnBackend ignores them).
        self.server_args = server_args
        self.prefill_attention_backend_str = attention_backend
        self.decode_attention_backend_str = attention_backend
        self.page_size = 1
        self.sliding_window_size = None
        self.is_draft_worker = False
        self.kv_cache_dtype = dtype
        self.dtype = dtype
        self.spec_algorithm = SpeculativeAlgorithm.from_string("DFLASH")
        self.model_config = ModelConfigLike(num_heads, num_kv_heads, head_dim, context_len)
        self.req_to_token_pool = _build(ReqToTokenPool, size=max_bs, max_context_len=context_len,
                                        device=device, enable_memory_saver=False)
        self.token_to_kv_pool = _build(MHATokenToKVPool, size=kv_size, page_size=1, dtype=dtype,
                                       head_num=num_kv_heads, head_dim=head_dim, layer_num=1,
                                       device=device, enable_memory_saver=False,
                                       start_layer=0, end_layer=0)
        self.token_to_kv_pool_allocator = None
        self.kv_index_translator = KVIndexTranslator(
            req_to_token=self.req_to_token_pool.req_to_token,
            token_to_kv_pool_allocator=None,
            token_to_kv_pool=self.token_to_kv_pool,
            page_size=1,
            device=device,
        )
        self._torch = torch

    def decode_num_tokens_per_req(self, *, num_draft_tokens=None):
        # ModelRunner.decode_num_tokens_per_req for a DFLASH target runner.
        from sglang.srt.speculative.spec_utils import resolve_num_tokens_per_req

        return resolve_num_tokens_per_req(phase="target_verify", spec_algorithm=self.spec_algorithm,
                                          is_draft_worker=False, num_draft_tokens=num_draft_tokens)


class AllocatorView:
    """Harness stand-in for the token-to-KV allocator: FlashInferAttnBackend only
    asks it for its KV cache (to detect an SWA pool); no allocation happens here."""

    def __init__(self, kvcache):
        self._kvcache = kvcache

    def get_kvcache(self):
        return self._kvcache


def _build(cls, **kw):
    """Call a pool constructor with the subset of kwargs its signature takes."""
    import inspect

    sig = inspect.signature(cls.__init__)
    has_var = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
    args = {k: v for k, v in kw.items() if has_var or k in sig.parameters}
    return cls(**args)


def _model_dir() -> str:
    """A model directory with a config.json (ServerArgs takes a model path)."""
    import json
    import tempfile

    d = os.path.join(tempfile.gettempdir(), "ddtree-harness-model")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
                   "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 2,
                   "head_dim": 128, "num_hidden_layers": 1, "vocab_size": 1000,
                   "max_position_embeddings": 65536, "torch_dtype": "bfloat16"}, f)
    return d


MODEL_DIR = _model_dir()
