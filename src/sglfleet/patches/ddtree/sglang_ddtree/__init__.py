"""DDTree speculative decoding for sglang 0.5.23 (plugin package).

- ``config``: the server-argument rules (pure Python, used by sglang's argument resolution
  through patch 0015 and by the rollout's render/preflight checks).
- ``tree``: the draft tree (best-first by cumulative log-probability) and the acceptance walk
  (numpy, testable on CPU).
- ``worker``: ``DDTreeWorker``, a ``DFlashWorkerV2`` whose decode step drafts a tree instead of
  a chain (imports sglang; loaded on a GPU host only).
- ``plugin``: the ``sglang.srt.plugins`` entry point that makes DFLASH create ``DDTreeWorker``
  when ``--speculative-ddtree-budget`` is set.
"""

__version__ = "0.1.0"
